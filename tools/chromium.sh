#!/bin/sh
# Headless Chromium for the HTML report's browser test (tests/test_html_report.py): Debian's
# `chromium` package, installed with apt-get when missing and run as root. Prints the path of
# the browser on stdout; without one (not root, no apt-get, no package) it says why on stderr
# and exits 1, and the test is skipped with that message.
set -eu
find_browser() {
    for b in "${CHROMIUM:-}" chromium chromium-browser google-chrome; do
        [ -n "$b" ] || continue
        p=$(command -v "$b" 2>/dev/null) && { echo "$p"; return 0; }
    done
    return 1
}
find_browser && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing chromium (Debian package) for the HTML report's browser test" >&2
    apt-get update -qq >&2 || true
    if DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        chromium fonts-dejavu-core >/dev/null 2>&1; then
        find_browser && exit 0
    fi
    echo "apt-get could not install chromium" >&2
    exit 1
fi
echo "no chromium: install Debian's chromium package (apt-get install chromium) as root" >&2
exit 1
