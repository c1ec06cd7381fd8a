#!/usr/bin/env bash
# scripts/check-install.sh: installs weft as a user would and runs what it installed.
#  1. configures BUILD_DIR as scripts/demo.sh does (Release, tests and examples configured),
#     builds only the 'programs' target the demo builds (no test is built) and runs
#     'cmake --install' into a temporary prefix: installing right after the demo must work;
#  2. checks the tree: public headers, libweft.so/.a, the programs, no private header,
#     libweft.so exports only wf_* names (no wf__ internals), and every installed program
#     has a relative runtime path (RUNPATH $ORIGIN/...) and none into the build tree;
#  3. runs every installed program ('--help') from the prefix, then MOVES the prefix and runs
#     them again from there, with no LD_LIBRARY_PATH and no ldconfig; weft-train and train_gpt
#     train a few steps there on their bundled data (found beside the program, no WEFT_DIGITS);
#  4. builds a training program (examples/design_example.c: a model trained with Adam)
#     against the moved prefix four ways and runs each: pkg-config shared,
#     'pkg-config --static' as written in the README, pkg-config --static with libweft.a
#     (no libweft.so loaded), and a CMake project with find_package(weft) linking weft::weft
#     and weft::weft_static;
#  5. installs the same build again with 'cmake --install --prefix OTHER' (a relocated
#     install, as packagers do) and builds the CMake and pkg-config consumers against that.
# Usage: scripts/check-install.sh [BUILD_DIR]   (default build-install; WF_JOBS, WF_CMAKE_ARGS)
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/lib.sh"
cd "$WF_ROOT"

build="${1:-build-install}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
prefix="$tmp/prefix"
fail=0

say() { echo "check-install: $*"; }
bad() {
    echo "check-install: FAIL: $*" >&2
    fail=1
}

# --- 1. a demo-style build, then install ---------------------------------------------------
wf_configure "$build" -DCMAKE_BUILD_TYPE=Release -DWF_BUILD_EXAMPLES=ON \
    -DCMAKE_INSTALL_PREFIX="$prefix" >"$tmp/configure.log" ||
    { cat "$tmp/configure.log" >&2; exit 1; }
wf_build "$build" programs
if ! cmake --install "$build" >"$tmp/install.log" 2>&1; then
    cat "$tmp/install.log" >&2
    bad "cmake --install after building only 'programs' (what scripts/demo.sh builds)"
    exit 1
fi
say "installed into $prefix:"
(cd "$prefix" && find . -type f -o -type l | sed 's|^\./|  |' | sort)

# --- 2. the tree -------------------------------------------------------------------------
libdir="$(dirname "$(find "$prefix" -name 'libweft.so' | head -1)")"
[[ -n "$libdir" && -e "$libdir/libweft.so" ]] || { bad "no libweft.so installed"; exit 1; }
[[ -e "$libdir/libweft.a" ]] || bad "no libweft.a installed"
[[ -e "$libdir/pkgconfig/weft.pc" ]] || bad "no weft.pc in $libdir/pkgconfig"
[[ -e "$libdir/cmake/weft/weftConfig.cmake" ]] || bad "no weftConfig.cmake in $libdir/cmake/weft"
for h in include/weft/*.h; do
    [[ -f "$prefix/$h" ]] || bad "$h is not installed"
done
if find "$prefix" -name 'internal.h' | grep -q .; then bad "a private internal.h is installed"; fi
extra="$(find "$prefix/include" -type f | sed "s|^$prefix/||" | grep -v '^include/weft/[a-z0-9_]*\.h$' || true)"
[[ -z "$extra" ]] || bad "unexpected files under include/: $extra"
exported="$(nm -D --defined-only "$libdir/libweft.so" | awk '{print $3}' | grep -v '^_init$\|^_fini$' | sort)"
leaked="$(grep -v '^wf_[a-z0-9]' <<<"$exported" || true)"
leaked+="$(grep '^wf__' <<<"$exported" || true)"
[[ -z "$leaked" ]] || bad "libweft.so exports names that are not public API: $(tr '\n' ' ' <<<"$leaked")"
say "libweft.so exports $(wc -l <<<"$exported") symbols, all wf_*"

programs=()
for f in "$prefix"/bin/*; do
    [[ -f "$f" && -x "$f" ]] && programs+=("$(basename "$f")")
done
for p in weft-run weft-train train_gpt; do
    [[ -x "$prefix/bin/$p" ]] || bad "bin/$p is not installed"
done
for p in "${programs[@]}"; do
    rp="$(readelf -d "$prefix/bin/$p" | sed -n 's/.*(RUNPATH).*\[\(.*\)\]/\1/p;s/.*(RPATH).*\[\(.*\)\]/\1/p')"
    # shellcheck disable=SC2016 # a literal $ORIGIN
    if readelf -d "$prefix/bin/$p" | grep -q 'NEEDED.*libweft' && [[ "$rp" != *'$ORIGIN/'* ]]; then
        bad "bin/$p loads libweft.so but its runtime path is '$rp', not relative (\$ORIGIN/...)"
    fi
    [[ "$rp" != *"$WF_ROOT"* ]] || bad "bin/$p's runtime path '$rp' points into the source tree"
done
say "installed programs: ${programs[*]}"

# --- 3. the programs start from the prefix, and from the prefix moved --------------------
run_programs()
{ # $1: prefix, $2: label
    local p
    for p in "${programs[@]}"; do
        if env -u LD_LIBRARY_PATH "$1/bin/$p" --help >"$tmp/help.txt" 2>&1; then
            say "$2: bin/$p --help ok ($(wc -l <"$tmp/help.txt") lines)"
        else
            sed 's/^/    /' "$tmp/help.txt" >&2
            bad "$2: bin/$p --help does not run"
        fi
    done
}
run_programs "$prefix" "install"
moved="$tmp/moved/somewhere/else"
mkdir -p "$(dirname "$moved")"
mv "$prefix" "$moved"
run_programs "$moved" "moved"

# The programs with bundled data find it beside themselves in the moved prefix (not at the
# path the install was configured with, nor in the source tree, which is still there), with
# no WEFT_DIGITS and no LD_LIBRARY_PATH: each names the file it read.
train_from()
{ # $1: prefix, $2: label
    if (cd "$tmp" && env -u LD_LIBRARY_PATH -u WEFT_DIGITS "$1/bin/weft-train" --steps 5 \
        >"$tmp/train.txt" 2>&1) && grep -q 'test accuracy' "$tmp/train.txt" &&
        grep -qF "the bundled digits: $1/bin/../" "$tmp/train.txt"; then
        say "$2: bin/weft-train: $(grep -o 'the bundled digits: .*' "$tmp/train.txt")"
        say "$2: bin/weft-train: $(grep 'test accuracy' "$tmp/train.txt" | tail -1)"
    else
        sed 's/^/    /' "$tmp/train.txt" >&2
        bad "$2: bin/weft-train does not train on its bundled digits"
    fi
    if (cd "$tmp" && env -u LD_LIBRARY_PATH "$1/bin/train_gpt" --steps 2 --context 16 \
        --d-model 32 --layers 1 --sample-len 10 >"$tmp/gpt.txt" 2>&1) &&
        grep -q 'train_gpt: 2 steps in' "$tmp/gpt.txt" && grep -qF "$1/bin/../" "$tmp/gpt.txt"; then
        say "$2: bin/train_gpt: $(grep -o "$1/bin/[^:]*" "$tmp/gpt.txt" | head -1)"
        say "$2: bin/train_gpt: $(grep 'train_gpt: 2 steps in' "$tmp/gpt.txt")"
    else
        sed 's/^/    /' "$tmp/gpt.txt" >&2
        bad "$2: bin/train_gpt does not train on its bundled text"
    fi
}
train_from "$moved" "moved"

# --- 4. the consumer: a training program -------------------------------------------------
cp examples/design_example.c "$tmp/consumer.c"
consumer_ok() { grep -q 'after 20 Adam steps: learning' "$1"; }

pc_consumers()
{ # $1: prefix, $2: label
    local pc
    pc="$(dirname "$(find "$1" -name weft.pc | head -1)")"
    local pcprefix
    pcprefix="$(PKG_CONFIG_PATH="$pc" pkg-config --variable=prefix weft)"
    if [[ "$(realpath -m "$pcprefix")" != "$(realpath -m "$1")" ]]; then
        bad "$2: weft.pc says prefix=$pcprefix, but it is in $1: weft.pc must find its" \
            "prefix from \${pcfiledir}"
        return
    fi
    local lib
    lib="$(PKG_CONFIG_PATH="$pc" pkg-config --variable=libdir weft)"
    # shellcheck disable=SC2046
    if cc -std=c11 -Wall -Werror "$tmp/consumer.c" -o "$tmp/pc_shared" \
        $(PKG_CONFIG_PATH="$pc" pkg-config --cflags --libs weft) &&
        LD_LIBRARY_PATH="$lib" "$tmp/pc_shared" >"$tmp/out.txt" 2>&1 && consumer_ok "$tmp/out.txt"; then
        say "$2: pkg-config consumer (shared): $(cat "$tmp/out.txt")"
    else
        cat "$tmp/out.txt" >&2 || true
        bad "$2: pkg-config consumer (shared)"
    fi
    # The README's static line, word for word (libweft.so is still the one found by -lweft).
    # shellcheck disable=SC2046
    if cc "$tmp/consumer.c" $(PKG_CONFIG_PATH="$pc" pkg-config --static --cflags --libs weft) \
        -o "$tmp/pc_static_flags" &&
        LD_LIBRARY_PATH="$lib" "$tmp/pc_static_flags" >"$tmp/out.txt" 2>&1 && consumer_ok "$tmp/out.txt"; then
        say "$2: 'pkg-config --static' consumer ok"
    else
        cat "$tmp/out.txt" >&2 || true
        bad "$2: cc design_example.c \$(pkg-config --static --cflags --libs weft)"
    fi
    # libweft.a itself, with everything 'pkg-config --static' lists for it.
    local flags=()
    read -r -a flags <<<"$(PKG_CONFIG_PATH="$pc" pkg-config --static --cflags --libs weft)"
    for i in "${!flags[@]}"; do
        [[ "${flags[$i]}" == -lweft ]] && flags[i]="$lib/libweft.a"
    done
    if cc -std=c11 -Wall -Werror "$tmp/consumer.c" -o "$tmp/pc_static" "${flags[@]}" &&
        env -u LD_LIBRARY_PATH "$tmp/pc_static" >"$tmp/out.txt" 2>&1 && consumer_ok "$tmp/out.txt"; then
        if ldd "$tmp/pc_static" | grep -q libweft; then
            bad "$2: the static consumer still loads libweft.so"
        else
            say "$2: pkg-config --static consumer (libweft.a, no libweft.so) ok"
        fi
    else
        cat "$tmp/out.txt" >&2 || true
        bad "$2: pkg-config --static consumer with libweft.a"
    fi
}

cmake_consumer()
{ # $1: prefix, $2: label
    local src="$tmp/cmake-src" bin="$tmp/cmake-bin-$2" t
    mkdir -p "$src"
    cp "$tmp/consumer.c" "$src/consumer.c"
    cat >"$src/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.20)
project(weft_consumer C)
find_package(weft 0.1 REQUIRED)
add_executable(consumer_shared consumer.c)
target_link_libraries(consumer_shared PRIVATE weft::weft)
add_executable(consumer_static consumer.c)
target_link_libraries(consumer_static PRIVATE weft::weft_static)
CM
    if ! { cmake -S "$src" -B "$bin" -G Ninja -DCMAKE_PREFIX_PATH="$1" &&
        cmake --build "$bin"; } >"$tmp/cc.log" 2>&1; then
        cat "$tmp/cc.log" >&2
        bad "$2: CMake find_package(weft) consumer does not build"
        return
    fi
    for t in consumer_shared consumer_static; do
        if env -u LD_LIBRARY_PATH "$bin/$t" >"$tmp/out.txt" 2>&1 && consumer_ok "$tmp/out.txt"; then
            say "$2: CMake find_package(weft) $t ok"
        else
            cat "$tmp/out.txt" >&2
            bad "$2: CMake find_package(weft) $t"
        fi
    done
    if ldd "$bin/consumer_static" | grep -q libweft; then
        bad "$2: weft::weft_static's consumer loads libweft.so"
    fi
}

pc_consumers "$moved" "moved"
cmake_consumer "$moved" "moved"

# --- 5. relocated install ----------------------------------------------------------------
other="$tmp/other"
cmake --install "$build" --prefix "$other" >"$tmp/install2.log"
run_programs "$other" "relocated"
train_from "$other" "relocated"
cmake_consumer "$other" "relocated"
pc_consumers "$other" "relocated"

if ((fail)); then
    echo "check-install: FAILED" >&2
    exit 1
fi
say "ok"
