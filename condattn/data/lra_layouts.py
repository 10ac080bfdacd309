"""The released file layouts of the five LRA tasks: what the readers (data/<task>.py) expect and the offline
stand-in generators (data/standins/<task>.py) write, kept in one place so that the two cannot drift apart."""

from __future__ import annotations

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
