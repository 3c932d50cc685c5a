"""test_docs.py — the documentation stays true where that is cheap to check: README.md is a manual
of at most 350 lines; every citation of a section of README.md, lab/NOTES.md or docs/*.md
(`lab/NOTES.md, "Grouped engine"`, also several titles joined by "and" or a comma, and a citation
broken over comment lines) names a heading of that file, and no two headings of a document share
a title; every repository file that README.md, docs/ or a code comment names exists; and no code
comment cites a numbered work period ("the seventh session"). No build and no GPU needed.

A heading matches a citation when its text, without markdown emphasis and backticks and without a
leading item number ("12. "), is the cited title or starts with it followed by a parenthesis
("Single calls on the grouped kernel" names "Single calls on the grouped kernel (lost; ...)").
"""
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import harness  # noqa: E402

SELF = "tests/cpu/test_docs.py"
README_MAX_LINES = 350
CITED_DOCS = ("lab/NOTES.md", "docs/design.md", "docs/numerics.md", "docs/performance.md")
CODE_DIRS = ("base", "spec", "kernels", "shim", "ref", "tools", "demo", "bench", "tests", "lab")
CODE_EXT = (".c", ".h", ".cu", ".cuh", ".py", ".sh", ".S", ".def", ".mk")
# top-level folders of the tree, and the extensions a cited file has
TOP = ("base", "spec", "kernels", "shim", "ref", "tools", "demo", "bench", "lab", "tests", "docs",
       "scripts")
PATH_RE = re.compile(r"(?<![\w./-])((?:%s)/[\w./-]*\w\.(?:c|h|cu|cuh|py|sh|md|mk|def|S|txt))"
                     r"(?![\w/])" % "|".join(TOP))
TOPFILE_RE = re.compile(r"(?<![\w./-])([A-Z][A-Z0-9_]+\.md)\b")
PERIOD_RE = re.compile(r"\b(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|"
                       r"eleventh|twelfth|\d+(?:st|nd|rd|th))\s+(?:work\s+)?(?:session|period)s?\b",
                       re.IGNORECASE)


def read(rel):
    with open(os.path.join(ROOT, rel), encoding="utf-8", errors="replace") as f:
        return f.read()


def tracked(*pathspecs):
    """The files git tracks under the pathspecs (or every file of the tree outside a checkout)."""
    try:
        out = subprocess.run(["git", "-C", ROOT, "ls-files", "--", *pathspecs],
                             capture_output=True, text=True, timeout=60)
        if out.returncode == 0 and out.stdout.strip():
            return [p for p in out.stdout.split("\n") if p]
    except (OSError, subprocess.SubprocessError):
        pass
    files = []
    for spec in pathspecs:
        base = os.path.join(ROOT, spec)
        if os.path.isfile(base):
            files.append(spec)
        for d, dirs, names in os.walk(base):
            dirs[:] = [x for x in dirs if not x.startswith(("build", "."))]
            files += [os.path.relpath(os.path.join(d, n), ROOT) for n in names]
    return files


def normalize(title):
    t = title.replace("`", "").replace("*", "")
    return " ".join(t.split())


def headings(rel):
    """The normalized headings of a markdown file, with and without a leading item number."""
    out = set()
    fence = False
    for line in read(rel).split("\n"):
        if line.startswith("```"):
            fence = not fence
        if fence:
            continue
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            h = normalize(m.group(1))
            out.add(h)
            out.add(re.sub(r"^\d+\.\s+", "", h))
    return out


def names_heading(title, heads):
    t = normalize(title)
    if " ... " in t:  # an elided title: its first and last words
        first, last = t.split(" ... ", 1)
        return any(h.startswith(first) and last in h[len(first):] for h in heads)
    return any(h == t or h.startswith(t + " (") for h in heads)


def placeholder(path):
    """kernels/NAME.cu, lab/probe_P.cu, tests/gpu/test_a.py: a pattern in a usage line, no file."""
    stem = os.path.basename(path).split(".")[0]
    return any(re.fullmatch(r"[A-Z]+|[a-z]", part) for part in stem.split("_"))


def comment_text(rel, text):
    """A code file's comments as one line of text (comment leaders dropped, lines joined), so that a
    citation broken over lines reads whole. Python and shell: # comments and docstrings; C: the
    text of // and /* */ comments."""
    if rel.endswith((".py", ".sh", ".mk")):
        parts = []
        for line in text.split("\n"):
            s = line.strip()
            i = s.find("#")
            if i >= 0:
                parts.append(s[i + 1:])
            elif rel.endswith(".py"):
                parts.append(s)  # docstrings and strings: harmless, citations live in them too
        return " ".join(" ".join(parts).split())
    parts = []
    for m in re.finditer(r"//[^\n]*|/\*.*?\*/", text, re.S):
        c = m.group(0)
        c = c[2:] if c.startswith("//") else c[2:-2]
        c = re.sub(r"(?m)^\s*\*(?!/)", " ", c)
        parts.append(c)
    return " ".join(" ".join(parts).split())


def doc_text(text):
    """A markdown file as one line of text, code blocks included (a citation may sit in one)."""
    return " ".join(text.split())


CITE_RE = re.compile(r'(%s|README(?:\.md)?),?\s+"([^"]{1,160})"'
                     r'((?:\s*(?:,|and|, and)\s*"[^"]{1,160}")*)'
                     % "|".join(re.escape(d) for d in CITED_DOCS))


def citations(text):
    """(doc, title) for every citation in the text ("README" stands for README.md)."""
    for m in CITE_RE.finditer(text):
        doc = "README.md" if m.group(1).startswith("README") else m.group(1)
        yield doc, m.group(2)
        for more in re.findall(r'"([^"]{1,160})"', m.group(3)):
            yield doc, more


def sources():
    """(path, flat text) of README.md, docs/*.md and every code file's comments."""
    docs = ["README.md"] + [p for p in tracked("docs") if p.endswith(".md")]
    for rel in docs:
        yield rel, doc_text(read(rel)), True
    for rel in tracked(*CODE_DIRS):
        if rel == SELF:
            continue  # its own examples of what must fail
        if rel.endswith(CODE_EXT) and os.path.isfile(os.path.join(ROOT, rel)):
            yield rel, comment_text(rel, read(rel)), False


def test_readme_is_a_short_manual():
    n = read("README.md").count("\n")
    harness.check(n <= README_MAX_LINES, f"README.md has {n} lines, more than {README_MAX_LINES}")


def test_citations_name_headings():
    heads = {d: headings(d) for d in CITED_DOCS + ("README.md",)
             if os.path.isfile(os.path.join(ROOT, d))}
    seen = 0
    for rel, text, _ in sources():
        for doc, title in citations(text):
            seen += 1
            harness.check(doc in heads, f"{rel}: cites {doc}, which does not exist")
            if doc in heads:
                harness.check(names_heading(title, heads[doc]),
                              f'{rel}: cites {doc}, "{title}": no such heading')
    # the scan itself works: the tree cites the notes in many places
    harness.check(seen >= 20, f"only {seen} citations found: the scan is broken")


def test_headings_are_unique():
    """A citation names a section by its title: no two headings of a document may share one."""
    for rel in ("README.md",) + CITED_DOCS:
        if not os.path.isfile(os.path.join(ROOT, rel)):
            continue
        seen = set()
        fence = False
        for line in read(rel).split("\n"):
            if line.startswith("```"):
                fence = not fence
            m = None if fence else re.match(r"^#{1,6}\s+(.*?)\s*$", line)
            if m:
                h = re.sub(r"^\d+\.\s+", "", normalize(m.group(1)))
                harness.check(h not in seen, f"{rel}: two headings \"{h}\"")
                seen.add(h)


def test_cited_files_exist():
    seen = 0
    for rel, text, _ in sources():
        found = {p for p in PATH_RE.findall(text) if not placeholder(p)}
        for path in found | set(TOPFILE_RE.findall(text)):
            if "*" in path or "%" in path:
                continue
            seen += 1
            harness.check(os.path.exists(os.path.join(ROOT, path)),
                          f"{rel}: names {path}, which is not in the tree")
    harness.check(seen >= 50, f"only {seen} file names found: the scan is broken")


def test_no_work_periods_in_code():
    for rel, text, is_doc in sources():
        if is_doc:
            continue
        for m in PERIOD_RE.finditer(text):
            harness.check(False, f"{rel}: a comment cites a work period: {m.group(0)!r}")


def test_the_checks_catch_what_they_should():
    heads = {"Grouped engine", "12. The n256 kernel's short last tiles on a second launch",
             "The n256 kernel's short last tiles on a second launch",
             "Single calls on the grouped kernel (lost; commit 77cec08^)"}
    harness.check(names_heading("Grouped engine", heads), "an exact title")
    harness.check(names_heading("The n256 kernel's short last tiles on a second launch", heads),
                  "a numbered item's title")
    harness.check(names_heading("Single calls on the grouped kernel", heads),
                  "a title with a parenthesis after it")
    harness.check(not names_heading("Grouped", heads), "a word of a title is no title")
    harness.check(names_heading("Single calls ... grouped kernel", heads), "an elided title")
    harness.check(placeholder("kernels/NAME.cu") and not placeholder("shim/wcache.h"), "pattern")
    text = comment_text("x.c", '/* as measured (lab/NOTES.md, "The sampled\n * refresh\'s '
                        'clusters" and "Grouped engine"); seventh session */')
    got = list(citations(text))
    harness.check(got == [("lab/NOTES.md", "The sampled refresh's clusters"),
                          ("lab/NOTES.md", "Grouped engine")], f"citations over lines: {got}")
    harness.check(PERIOD_RE.search(text), "a work period")
    harness.check(PATH_RE.findall("see scripts/probe_kloop.cu and `shim/wcache.h`.")
                  == ["scripts/probe_kloop.cu", "shim/wcache.h"], "file names")
    harness.check(not PATH_RE.findall("build/lab/libtrace.so, stats.%r.jsonl"), "not file names")
    harness.check(TOPFILE_RE.findall("the rule (HOPPER.md).") == ["HOPPER.md"], "a top-level file")


if __name__ == "__main__":
    harness.run(test_readme_is_a_short_manual)
    harness.run(test_citations_name_headings)
    harness.run(test_headings_are_unique)
    harness.run(test_cited_files_exist)
    harness.run(test_no_work_periods_in_code)
    harness.run(test_the_checks_catch_what_they_should)
    sys.exit(harness.done())
