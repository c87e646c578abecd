#!/bin/sh
# onnxruntime's C API header (onnxruntime_c_api.h), which the custom-operator library of the
# onnxruntime target is compiled against. No PyPI wheel ships it; Debian 13 (trixie) has it
# in libonnxruntime-dev. The package is downloaded into a private folder, never installed:
#
#   sh tools/ort_headers.sh [DEST]        # default DEST: .cache/ort-headers
#
# DEST/include/onnxruntime/onnxruntime_c_api.h afterwards. On a machine whose own apt sources
# carry libonnxruntime-dev (Debian 13) plain `apt-get download` fetches it; elsewhere (Debian
# 12) apt-get runs with a private source list naming trixie on the machine's own Debian mirror
# (read from its apt sources, never written here), private lists and cache, and the system's
# dpkg status untouched. Without network the script says so and exits 0: the project still
# works, the onnxruntime target then fuses without custom operators.
set -u
dest="${1:-.cache/ort-headers}"
header="$dest/include/onnxruntime/onnxruntime_c_api.h"
[ -f "$header" ] && exit 0
say() { echo "ort_headers: $*" >&2; }
command -v apt-get >/dev/null 2>&1 || { say "no apt-get: onnxruntime C API header not available"; exit 0; }
command -v dpkg-deb >/dev/null 2>&1 || { say "no dpkg-deb: onnxruntime C API header not available"; exit 0; }
mkdir -p "$dest" || exit 0
dest=$(cd "$dest" && pwd)
work="$dest/.apt"
rm -rf "$work"
mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$work/deb"

# the machine's Debian mirror: the first URI of a source whose suites are not -security
mirror=""
for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    mirror=$(awk '
        /^[ \t]*$/ { if (uri != "" && sec == 0 && deb == 1) { print uri; exit } uri=""; sec=0; deb=0; next }
        /^URIs:/ { uri=$2 }
        /^Suites:/ { if ($0 ~ /security/) sec=1 }
        /^Types:/ { if ($0 ~ /(^|[ \t])deb([ \t]|$)/) deb=1 }
        END { if (uri != "" && sec == 0 && deb == 1) print uri }' "$f" | head -n1)
    [ -n "$mirror" ] && break
done
if [ -z "$mirror" ]; then
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$f" ] || continue
        mirror=$(awk '$1 == "deb" && $0 !~ /security/ {
            for (i = 2; i <= NF; i++) if ($i !~ /^\[/ && $i !~ /\]$/ && $i ~ /:\/\//) { print $i; exit } }' "$f" | head -n1)
        [ -n "$mirror" ] && break
    done
fi
keyring=""
for k in /usr/share/keyrings/debian-archive-keyring.gpg /etc/apt/trusted.gpg.d/debian-archive-trixie-automatic.gpg; do
    [ -f "$k" ] && { keyring="$k"; break; }
done

fetch() {  # $1: extra apt-get options (a private source list, or none)
    # shellcheck disable=SC2086
    (cd "$work/deb" && apt-get -qq $1 \
        -o Dir::State::Lists="$work/lists" -o Dir::Cache="$work/cache" \
        -o Dir::State::status=/dev/null -o Debug::NoLocking=1 update >/dev/null 2>"$work/err" \
     && apt-get -qq $1 \
        -o Dir::State::Lists="$work/lists" -o Dir::Cache="$work/cache" \
        -o Dir::State::status=/dev/null -o Debug::NoLocking=1 download libonnxruntime-dev \
        >/dev/null 2>>"$work/err")
}

got=""
if [ -n "$mirror" ]; then
    signed=""
    [ -n "$keyring" ] && signed=" [signed-by=$keyring]"
    echo "deb$signed $mirror trixie main" >"$work/sources.list"
    fetch "-o Dir::Etc::SourceList=$work/sources.list -o Dir::Etc::SourceParts=/dev/null" && got=1
fi
if [ -z "$got" ]; then  # Debian 13 or later: the machine's own sources have the package
    fetch "" && got=1
fi
deb=$(ls "$work"/deb/libonnxruntime-dev_*.deb 2>/dev/null | head -n1)
if [ -z "$got" ] || [ -z "$deb" ]; then
    say "could not download libonnxruntime-dev ($(tail -n1 "$work/err" 2>/dev/null)):"
    say "onnxruntime C API header not available; custom operators are disabled"
    rm -rf "$work"
    exit 0
fi
dpkg-deb -x "$deb" "$work/x" || { say "dpkg-deb failed on $deb"; rm -rf "$work"; exit 0; }
inc=$(find "$work/x" -name onnxruntime_c_api.h | head -n1)
if [ -z "$inc" ]; then
    say "$deb holds no onnxruntime_c_api.h"
    rm -rf "$work"
    exit 0
fi
mkdir -p "$dest/include/onnxruntime"
cp "$(dirname "$inc")"/*.h "$dest/include/onnxruntime/"
basename "$deb" >"$dest/PACKAGE"
find "$work/x" -path '*copyright' -exec cp {} "$dest/COPYRIGHT" \; 2>/dev/null
rm -rf "$work"
say "onnxruntime C API header: $header ($(cat "$dest/PACKAGE"))"
exit 0
