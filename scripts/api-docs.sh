#!/usr/bin/env bash
# scripts/api-docs.sh: builds the API reference (HTML) from the comments of the public
# headers, include/weft/*.h, with Doxygen (Debian's doxygen; scripts/setup.sh --tests
# installs it), into BUILD_DIR/api (not in the sources). Fails if a WF_API declaration has no
# comment or Doxygen prints any warning: CI's 'docs' stage runs it.
# The headers keep plain /* */ comments; scripts/api_docs_filter.py hands them to Doxygen as
# documentation comments (it says how).
# Usage: scripts/api-docs.sh [BUILD_DIR]   (default build-docs; open BUILD_DIR/api/index.html)
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/lib.sh"
cd "$WF_ROOT"

out="${1:-build-docs}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"

command -v doxygen >/dev/null || {
    echo "api-docs: doxygen is not installed (scripts/setup.sh --tests installs it)" >&2
    exit 1
}
python3 scripts/api_docs_filter.py --check include/weft/*.h || {
    echo "api-docs: FAIL: every WF_API declaration needs a comment (above it, or above the" \
        "block of declarations it belongs to)" >&2
    exit 1
}

version="$(sed -n 's/^project(weft VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)"
rm -rf "$out/api"
cat >"$out/Doxyfile" <<DOX
PROJECT_NAME           = weft
PROJECT_NUMBER         = $version
PROJECT_BRIEF          = "A dataflow runtime for tensor programs: the C API"
OUTPUT_DIRECTORY       = $out/api
INPUT                  = $WF_ROOT/include/weft
FILE_PATTERNS          = *.h
STRIP_FROM_PATH        = $WF_ROOT/include
INPUT_FILTER           = "python3 $WF_ROOT/scripts/api_docs_filter.py"
FILTER_SOURCE_FILES    = NO
OPTIMIZE_OUTPUT_FOR_C  = YES
JAVADOC_AUTOBRIEF      = YES
DISTRIBUTE_GROUP_DOC   = YES
MARKDOWN_SUPPORT       = NO
AUTOLINK_SUPPORT       = YES
EXTRACT_ALL            = YES
EXTRACT_STATIC         = YES
TYPEDEF_HIDES_STRUCT   = NO
SOURCE_BROWSER         = NO
GENERATE_HTML          = YES
HTML_OUTPUT            = .
GENERATE_LATEX         = NO
SEARCHENGINE           = NO
HAVE_DOT               = NO
CLASS_GRAPH            = NO
INCLUDE_GRAPH          = NO
INCLUDED_BY_GRAPH      = NO
ENABLE_PREPROCESSING   = YES
MACRO_EXPANSION        = YES
EXPAND_ONLY_PREDEF     = YES
PREDEFINED             = WF_API= WF_NODISCARD= "WF_PRINTF(a,b)=" __cplusplus
QUIET                  = YES
WARNINGS               = YES
WARN_IF_UNDOCUMENTED   = NO
WARN_IF_DOC_ERROR      = YES
WARN_NO_PARAMDOC       = NO
WARN_AS_ERROR          = NO
WARN_LOGFILE           = $out/doxygen-warnings.log
DOX
doxygen "$out/Doxyfile"
if [[ -s "$out/doxygen-warnings.log" ]]; then
    cat "$out/doxygen-warnings.log" >&2
    echo "api-docs: FAIL: Doxygen warned $(wc -l <"$out/doxygen-warnings.log") times" \
        "(above)" >&2
    exit 1
fi
echo "api-docs: $(find "$out/api" -name '*.html' | wc -l) pages in $out/api (open index.html);" \
    "no warning"
