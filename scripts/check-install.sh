#!/usr/bin/env bash
# scripts/check-install.sh: installs weft as a user would and builds programs against it.
#  1. configures a library-only build (no tests, perf, examples) with CMAKE_INSTALL_PREFIX set
#     to a temporary prefix, builds it and runs 'cmake --install';
#  2. checks the tree: public headers and libweft.so/.a installed, no private header, and
#     libweft.so exports only wf_* names (no wf__ internals);
#  3. compiles and runs a consumer with 'pkg-config --cflags --libs weft' (shared) and one
#     against libweft.a;
#  4. configures, builds and runs a CMake project with find_package(weft) linking weft::weft
#     and one linking weft::weft_static;
#  5. installs the same build again with 'cmake --install --prefix OTHER' (a relocated
#     install, as packagers do) and runs the CMake consumer and pkg-config against that.
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

wf_configure "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$prefix" \
    -DWF_BUILD_TESTS=OFF -DWF_BUILD_PERF=OFF -DWF_BUILD_EXAMPLES=OFF >"$tmp/configure.log" ||
    { cat "$tmp/configure.log" >&2; exit 1; }
wf_build "$build"
cmake --install "$build" >"$tmp/install.log"
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

# --- the consumer: uses a task group, a task graph and the error path --------------------
cat >"$tmp/consumer.c" <<'C'
#include <weft/weft.h>

#include <stdio.h>

static int add(void *arg)
{
    __atomic_fetch_add((int *)arg, 1, __ATOMIC_RELAXED);
    return 0;
}

int main(void)
{
    wf_runtime *rt;
    wf_runtime_opts o = { .n_workers = 2 };
    if (wf_runtime_create(&rt, &o) < 0) {
        fprintf(stderr, "consumer: %s\n", wf_last_errmsg());
        return 1;
    }
    int n = 0, rc;
    wf_group g;
    if ((rc = wf_group_init(&g, rt)) == 0) {
        for (int i = 0; i < 1000 && rc == 0; i++)
            rc = wf_spawn(&g, add, &n);
        int w = wf_group_wait(&g);
        rc = rc ? rc : w;
        wf_group_deinit(&g);
    }
    wf_runtime_destroy(rt);
    if (rc != 0 || n != 1000 || wf_version() != WF_VERSION_HEX) {
        fprintf(stderr, "consumer: rc %d (%s), n %d, version %x\n", rc, wf_strerror(rc), n,
                (unsigned)wf_version());
        return 1;
    }
    printf("consumer ok: 1000 tasks, weft %d.%d.%d\n", WF_VERSION_MAJOR, WF_VERSION_MINOR,
           WF_VERSION_PATCH);
    return 0;
}
C

pc_consumers()
{ # $1: prefix, $2: label
    local pc
    pc="$(dirname "$(find "$1" -name weft.pc | head -1)")"
    local pcprefix
    pcprefix="$(PKG_CONFIG_PATH="$pc" pkg-config --variable=prefix weft)"
    if [[ "$(realpath -m "$pcprefix")" != "$(realpath -m "$1")" ]]; then
        # The fix: in cmake/weft.pc.in 'prefix=${pcfiledir}/@WF_PC_TO_PREFIX@', and before
        # its configure_file() in CMakeLists.txt:
        #   file(RELATIVE_PATH WF_PC_TO_PREFIX "/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/")
        #   string(REGEX REPLACE "/$" "" WF_PC_TO_PREFIX "${WF_PC_TO_PREFIX}")
        bad "$2: weft.pc says prefix=$pcprefix, but it was installed in $1: weft.pc must find" \
            "its prefix from \${pcfiledir} (see the comment above this line in $0)"
        return
    fi
    # shellcheck disable=SC2046
    if cc -std=c11 -Wall -Werror "$tmp/consumer.c" -o "$tmp/pc_shared" \
        $(PKG_CONFIG_PATH="$pc" pkg-config --cflags --libs weft) &&
        LD_LIBRARY_PATH="$(dirname "$pc")" "$tmp/pc_shared"; then
        say "$2: pkg-config consumer (shared) ok"
    else
        bad "$2: pkg-config consumer (shared)"
    fi
    # libweft.a, with the libraries of weft.pc's Requires.private linked shared. (Not
    # 'pkg-config --static': that also asks for what a static libhwloc would need, -ludev
    # among them, which Debian's libhwloc-dev does not bring.)
    local req deps=()
    req="$(PKG_CONFIG_PATH="$pc" pkg-config --print-requires-private weft | awk '{print $1}')"
    # shellcheck disable=SC2086 # one word per package
    [[ -z "$req" ]] || read -r -a deps <<<"$(pkg-config --libs $req)"
    # shellcheck disable=SC2046
    if cc -std=c11 -Wall -Werror "$tmp/consumer.c" -o "$tmp/pc_static" \
        $(PKG_CONFIG_PATH="$pc" pkg-config --cflags weft) \
        "$(PKG_CONFIG_PATH="$pc" pkg-config --variable=libdir weft)/libweft.a" \
        "${deps[@]}" -pthread -lm &&
        "$tmp/pc_static"; then
        if ldd "$tmp/pc_static" | grep -q libweft; then
            bad "$2: the static consumer still loads libweft.so"
        else
            say "$2: pkg-config consumer (static libweft.a) ok"
        fi
    else
        bad "$2: pkg-config consumer (static libweft.a)"
    fi
}

cmake_consumer()
{ # $1: prefix, $2: label
    local src="$tmp/cmake-src" bin="$tmp/cmake-bin-$2"
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
    if cmake -S "$src" -B "$bin" -G Ninja -DCMAKE_PREFIX_PATH="$1" >"$tmp/cc.log" 2>&1 &&
        cmake --build "$bin" >>"$tmp/cc.log" 2>&1 &&
        "$bin/consumer_shared" && "$bin/consumer_static"; then
        say "$2: CMake find_package(weft) consumers (weft::weft, weft::weft_static) ok"
    else
        cat "$tmp/cc.log" >&2
        bad "$2: CMake find_package(weft) consumer"
    fi
}

pc_consumers "$prefix" "install"
cmake_consumer "$prefix" "install"

# --- 5. relocated install ----------------------------------------------------------------
moved="$tmp/moved"
cmake --install "$build" --prefix "$moved" >"$tmp/install2.log"
cmake_consumer "$moved" "relocated"
pc_consumers "$moved" "relocated"

if ((fail)); then
    echo "check-install: FAILED" >&2
    exit 1
fi
say "ok"
