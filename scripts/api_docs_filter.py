#!/usr/bin/env python3
# scripts/api_docs_filter.py: Doxygen's INPUT_FILTER for include/weft/*.h (scripts/api-docs.sh),
# and the check that every WF_API declaration has a comment (--check).
# The headers keep plain C comments in one order (what it does, Returns, Ownership, Threads);
# Doxygen only reads '/** */' comments, so this filter hands it each header with:
#   - the file's opening comment as the file's documentation (@file);
#   - a comment that starts a line and is followed by a declaration as that declaration's
#     documentation ('/**'), and a comment after code on its line as the code's ('/**<');
#   - a comment followed by several declarations with no blank line between them (wf_add,
#     wf_sub, ...) as one member group, whose comment documents each of them
#     (DISTRIBUTE_GROUP_DOC);
#   - the '---- Section ----' separators left as plain comments;
#   - '<', '>', '\', '@', '#' and '%' inside comments escaped, so text such as
#     <weft/core.h> or "#4213" stays text and is not read as markup.
# Line numbers are kept (no line is added or removed), so Doxygen's warnings point at the
# header's own lines.
# Usage: api_docs_filter.py HEADER          (prints the filtered header)
#        api_docs_filter.py --check HEADER...  (exit 1, naming each WF_API declaration
#                                               without a comment)
import re
import sys

DECL = re.compile(r"\s*WF_API\b")


def comment_spans(lines):
    """Yields (start_line, start_col, end_line, end_col) of each /* */ comment."""
    in_c = False
    for i, l in enumerate(lines):
        j = 0
        while j < len(l):
            if not in_c:
                k = l.find("/*", j)
                q = l.find('"', j)
                if q != -1 and (k == -1 or q < k):  # skip string literals (macros' strings)
                    e = q + 1
                    while e < len(l) and l[e] != '"':
                        e += 2 if l[e] == "\\" else 1
                    j = e + 1
                    continue
                if k == -1:
                    break
                in_c, s = True, (i, k)
                j = k + 2
            else:
                k = l.find("*/", j)
                if k == -1:
                    break
                in_c = False
                yield (s[0], s[1], i, k)
                j = k + 2


def escape(text):
    return re.sub(r"([<>\\@#%])", r"\\\1", text)


def next_code(lines, i):
    """Index of the first non-blank line after line i, or None."""
    for j in range(i + 1, len(lines)):
        if lines[j].strip():
            return j
    return None


def decl_block(lines, j):
    """The WF_API declarations starting at line j with no blank line between them: the index
    of each one's first line, and the last line of the block."""
    starts, last, k = [], j, j
    while k < len(lines) and lines[k].strip():
        if DECL.match(lines[k]):
            starts.append(k)
        elif not starts or lines[k].lstrip().startswith(("/*", "#")):
            break
        last = k
        k += 1
    return starts, last


def filter_header(text):
    lines = text.split("\n")
    out = list(lines)
    spans = list(comment_spans(lines))
    first = True
    # Work from the last comment to the first, so that column offsets stay valid.
    edits = []  # (line, col, old_len, new_text)
    group_ends = []
    for (sl, sc, el, ec) in spans:
        before = lines[sl][:sc]
        body_first = lines[sl][sc + 2 :]
        is_file = first and not before.strip()
        first = False
        trailing = bool(before.strip())
        separator = body_first.lstrip().startswith("----")
        if separator or body_first.startswith("*"):
            continue
        if is_file:
            # "/* weft/ops.h: the op ..." -> "/** @file weft/ops.h weft/ops.h: the op ..."
            m = re.match(r"\s*(weft/\w+\.h):", body_first)
            opener = "/** @file " + (m.group(1) + " " if m else "")
        elif trailing:
            # a comment after code documents that code, unless the line closes a block
            opener = "/**< " if not before.strip().startswith("#endif") else None
        else:
            opener = "/** "
            j = next_code(lines, el)
            if j is not None:
                starts, last = decl_block(lines, j)
                if len(starts) > 1:
                    opener = "/**@{*/ /** "
                    group_ends.append(last)
        if opener is None:
            continue
        edits.append((sl, sc, el, ec, opener))
    for (sl, sc, el, ec, opener) in reversed(edits):
        if sl == el:
            l = out[sl]
            inner = l[sc + 2 : ec]
            out[sl] = l[:sc] + opener + escape(inner.lstrip() if opener.endswith(" ") else inner) + l[ec:]
        else:
            l = out[el]
            out[el] = escape(l[:ec]) + l[ec:]
            for m in range(sl + 1, el):
                out[m] = escape(out[m])
            l = out[sl]
            out[sl] = l[:sc] + opener + escape(l[sc + 2 :].lstrip())
    for last in group_ends:
        out[last] = out[last] + " /**@}*/"
    return "\n".join(out)


def check(paths):
    bad = 0
    for p in paths:
        lines = open(p, encoding="utf-8").read().split("\n")
        documented = set()
        spans = list(comment_spans(lines))
        # comments that open their line (not after code), by the line they end on
        ends = {el for (sl, sc, el, _) in spans if not lines[sl][:sc].strip()}
        trailing = {sl for (sl, sc, _, _) in spans if lines[sl][:sc].strip()}
        for i, l in enumerate(lines):
            if not DECL.match(l):
                continue
            j = i - 1
            while j >= 0 and not lines[j].strip():
                j -= 1
            if j in ends and lines[j].rstrip().endswith("*/"):
                documented.update(decl_block(lines, i)[0])
            if i in trailing:
                documented.add(i)
        for i, l in enumerate(lines):
            if DECL.match(l) and i not in documented:
                print(f"{p}:{i + 1}: WF_API declaration without a comment: {l.strip()}")
                bad += 1
    return bad


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "--check":
        n = check(sys.argv[2:])
        sys.exit(1 if n else 0)
    if len(sys.argv) != 2:
        sys.exit("usage: api_docs_filter.py HEADER | --check HEADER...")
    sys.stdout.write(filter_header(open(sys.argv[1], encoding="utf-8").read()))
