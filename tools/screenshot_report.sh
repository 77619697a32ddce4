#!/bin/sh
# Screenshot an HTML report with headless Chromium, to look at what render_html drew.
#
#   tools/screenshot_report.sh REPORT.html OUT.png [WIDTH,HEIGHT]
#
# The window defaults to 1400,1800; the page is cut there, so pass a taller window
# (e.g. 1400,6000) to see a long graph whole. Needs `chromium` (Debian: apt-get
# install chromium); the tests never call this.
set -eu
if [ $# -lt 2 ]; then
    echo "usage: $0 REPORT.html OUT.png [WIDTH,HEIGHT]" >&2
    exit 2
fi
report=$(realpath "$1")
out=$(realpath -m "$2")
size=${3:-1400,1800}
chrome=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [ -z "$chrome" ]; then
    echo "$0: no chromium found (apt-get install chromium)" >&2
    exit 1
fi
"$chrome" --headless --no-sandbox --disable-gpu --hide-scrollbars \
    --screenshot="$out" --window-size="$size" "file://$report" 2>/dev/null
test -s "$out" && echo "$out"
