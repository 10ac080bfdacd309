"""The released file layouts of the five LRA tasks: what the readers (data/<task>.py) expect and the offline
stand-in generators (data/standins/<task>.py) write, kept in one place so that the two cannot drift apart."""

from __future__ import annotations

from pathlib import Path

# The release archive (lra_release.gz) unpacks to DEST/lra_release/lra_release/<task folder> (the archive's own top
# folder inside the one it is unpacked into, as the LRA download scripts leave it); a single lra_release level is
# also common. The readers look in every such place, so no file has to move.
RELEASE = "lra_release"
LISTOPS_FOLDER, RETRIEVAL_FOLDER, PATHFINDER_FOLDER = "listops-1000", "tsv_data", "pathfinder32"


def release_folders(root: str | Path, folder: str) -> list[Path]:
    """Where a task's release `folder` (listops-1000, tsv_data, pathfinder32) may sit for `data.root` = `root`:
    root itself, root/folder, root/lra_release[/lra_release]/folder, and, for the default root
    DEST/lra_release/folder, the doubled DEST/lra_release/lra_release/folder."""
    root = Path(root)
    out = [root, root / folder, root / RELEASE / folder, root / RELEASE / RELEASE / folder]
    if root.name == folder and root.parent.name == RELEASE:
        out.append(root.parent / RELEASE / folder)
    return list(dict.fromkeys(out))


def where(root: str | Path, folder: str) -> str:
    """The places `release_folders` looks, for error messages."""
    return ", ".join(str(p) for p in release_folders(root, folder))

# ListOps (lra_release/listops-1000): basic_{train,val,test}.tsv, a `Source<TAB>Target` header, then one
# expression a line over these operators, values and closing bracket (parentheses group the arguments).
MIN, MAX, MED, SUM_MOD, END = "[MIN", "[MAX", "[MED", "[SM", "]"
OPERATORS = (MIN, MAX, MED, SUM_MOD)
VALUES = tuple(range(10))
LISTOPS_HEADER = ("Source", "Target")
LISTOPS_SPLITS = ("train", "val", "test")


def listops_file(split: str) -> str:
    return f"basic_{split}.tsv"


# Text (IMDb, aclImdb_v1.tar.gz): aclImdb/{train,test}/{neg,pos}/*.txt, label = the folder (neg = 0, pos = 1).
IMDB_LABELS = {"neg": 0, "pos": 1}
IMDB_SPLITS = ("train", "test")

# Retrieval (lra_release/tsv_data): one TSV per split, `label id1 id2 text1 text2`, no header.
AAN_FILES = {"train": "new_aan_pairs.train.tsv", "val": "new_aan_pairs.eval.tsv", "test": "new_aan_pairs.test.tsv"}

# Image (CIFAR-10 python release): cifar-10-batches-py/{data_batch_1..5, test_batch}, pickled dicts.
CIFAR_TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR_TEST_FILE = "test_batch"
CIFAR_SIZE = 32
CIFAR_CLASSES = 10

# Pathfinder (lra_release/pathfinder32): <variant>/metadata/<k>.npy + <variant>/imgs/<k>/sample_<i>.png;
# the variant names the paddles per contour.
PATHFINDER_VARIANTS = {"curv_baseline": 6, "curv_contour_length_9": 9, "curv_contour_length_14": 14}
