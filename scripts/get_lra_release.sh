#!/usr/bin/env bash
# Fetch and unpack the Long Range Arena release (lra_release.gz, ~7 GB unpacked) for SCALE=paper runs.
#   scripts/get_lra_release.sh [DEST]      (default DEST: $CONDATTN_DATA or ./data)
# The archive unpacks to DEST/lra_release/lra_release/{listops-1000,tsv_data,pathfinder32,...} (its own top folder
# inside lra_release/). condattn reads that doubled layout as it is, and a single DEST/lra_release/<task> level too:
# with CONDATTN_DATA=DEST the default data roots find ListOps, Retrieval and Pathfinder either way; nothing is moved.
# Fails fast (20 s connect timeout) with a clear message where the internet is not reachable.
set -euo pipefail
URL="https://storage.googleapis.com/long-range-arena/lra_release.gz"
DEST="${1:-${CONDATTN_DATA:-data}}"
mkdir -p "$DEST"
if ! curl -fsSI --connect-timeout 20 "$URL" > /dev/null; then
  echo "cannot reach $URL (offline?). Download lra_release.gz elsewhere and unpack it under $DEST:" >&2
  echo "  tar -xzf lra_release.gz -C $DEST   # gives $DEST/lra_release/lra_release/... (read as it is)" >&2
  exit 2
fi
curl -fL --connect-timeout 20 "$URL" -o "$DEST/lra_release.gz"
tar -xzf "$DEST/lra_release.gz" -C "$DEST"
for base in "$DEST/lra_release/lra_release" "$DEST/lra_release"; do
  if [ -f "$base/listops-1000/basic_train.tsv" ]; then
    echo "unpacked: $base/{listops-1000,tsv_data,pathfinder32}"
    echo "run e.g. make reproduce-table-4 SCALE=paper CONDATTN_DATA=$DEST"
    exit 0
  fi
done
echo "unpacked under $DEST, but found no listops-1000/basic_train.tsv in $DEST/lra_release/lra_release or" \
     "$DEST/lra_release; list the archive (tar -tzf $DEST/lra_release.gz | head) and set data.root" >&2
exit 3
