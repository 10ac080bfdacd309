#!/usr/bin/env bash
# Fetch and unpack the Long Range Arena release (lra_release.gz, ~7 GB unpacked) for SCALE=paper runs.
#   scripts/get_lra_release.sh [DEST]      (default DEST: $CONDATTN_DATA or ./data)
# Afterwards: DEST/lra_release/listops-1000/basic_{train,val,test}.tsv, ... — the layout condattn reads.
# Fails fast (20 s connect timeout) with a clear message where the internet is not reachable.
set -euo pipefail
URL="https://storage.googleapis.com/long-range-arena/lra_release.gz"
DEST="${1:-${CONDATTN_DATA:-data}}"
mkdir -p "$DEST"
if ! curl -fsSI --connect-timeout 20 "$URL" > /dev/null; then
  echo "cannot reach $URL (offline?). Download lra_release.gz elsewhere and unpack it under $DEST:" >&2
  echo "  tar -xzf lra_release.gz -C $DEST   # gives $DEST/lra_release/..." >&2
  exit 2
fi
curl -fL --connect-timeout 20 "$URL" -o "$DEST/lra_release.gz"
tar -xzf "$DEST/lra_release.gz" -C "$DEST"
echo "unpacked under $DEST/lra_release; run e.g. make reproduce-table-4 SCALE=paper CONDATTN_DATA=$DEST"
