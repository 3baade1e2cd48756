#!/usr/bin/env bash
# test_readme.sh BUILD_DIR SOURCE_DIR: what README.md tells a user exists. Every `xtc COMMAND`
# it shows is a command of `xtc --help`, and every --option written after it (in a code block
# line, an inline code span or a row of the command table) is in `xtc COMMAND --help`; an option
# shown without a command is in some command's help or in xtc --help; a --cpu=NAME it names is in
# `xtc compile --cpu=help`. Every C API name (xtc_*, Xtc*, XTC_*) is declared in include/xtc.h,
# or, for an XTC_ environment variable, read by getenv() in the sources or by a CI or test
# script. Every repository path it names exists, the Layout table lists exactly the top-level
# folders of the tree, and the file stays under 400 lines. Runs in about a second.
set -u
build=$1
src=$2
xtc=$build/xtc
py=/usr/bin/python3
[ -x $py ] || py=python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# the help texts the README is checked against
"$xtc" --help > "$tmp/help.txt" 2>&1 || { echo "FAIL: xtc --help"; exit 1; }
cmds=$(sed -n 's/^  \([a-z][a-z-]*\)  .*/\1/p' "$tmp/help.txt")
[ -n "$cmds" ] || { echo "FAIL: no commands in xtc --help"; exit 1; }
for c in $cmds; do
  "$xtc" "$c" --help > "$tmp/help.$c.txt" 2>&1 || { echo "FAIL: xtc $c --help"; exit 1; }
done
"$xtc" compile --cpu=help > "$tmp/cpus.txt" 2>&1 || { echo "FAIL: xtc compile --cpu=help"; exit 1; }

cat > "$tmp/check.py" <<'PY'
import os, re, subprocess, sys

src, tmp, cmds = sys.argv[1], sys.argv[2], sys.argv[3].split()
readme = open(os.path.join(src, "README.md"), encoding="utf-8").read()
lines = readme.split("\n")
fails = []
checked = {"commands": 0, "options": 0, "api": 0, "paths": 0}

def fail(msg):
    fails.append(msg)

helps = {c: open(os.path.join(tmp, "help.%s.txt" % c)).read() for c in cmds}
top_help = open(os.path.join(tmp, "help.txt")).read()  # options of xtc itself (xtc --OPTION)
cpus = set(open(os.path.join(tmp, "cpus.txt")).read().split())
OTHER = re.compile(r"^\s*(?:\$ )?(ctest|cmake|cc|gcc|pkg-config|python3|bash|git|mpirun|mpiexec|"
                   r"sudo|apt-get|export|taskset)\b")
OPT = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)(?:=([^\s`|\]]+))?")

def help_has(text, opt):
    return re.search(r"(?<![\w-])" + re.escape(opt) + r"(?![\w-])", text) is not None

def check_text(text, where):
    """One code line, code span or table row: xtc COMMAND and the options after it."""
    text = re.sub(r"(?<!\S)#\s.*$", "", text)  # a shell comment
    found = list(re.finditer(r"(?<![\w./-])xtc ([a-z][a-z-]*)", text))
    for i, m in enumerate(found):
        cmd = m.group(1)
        if cmd not in cmds:
            if re.search(r"`xtc %s\b|^\s*(?:\$ )?xtc %s\b" % (cmd, cmd), text):
                fail("%s: 'xtc %s' is not a command of xtc --help" % (where, cmd))
            continue
        checked["commands"] += 1
        end = found[i + 1].start() if i + 1 < len(found) else len(text)
        for o in OPT.finditer(text, m.end(), end):
            checked["options"] += 1
            if not help_has(helps[cmd], o.group(1)):
                fail("%s: xtc %s has no option %s (xtc %s --help)" % (where, cmd, o.group(1), cmd))
            check_value(o, where)
    if not found and not OTHER.search(text):
        for o in OPT.finditer(text):
            checked["options"] += 1
            if not any(help_has(h, o.group(1)) for h in list(helps.values()) + [top_help]):
                fail("%s: option %s is in no command's --help" % (where, o.group(1)))
            check_value(o, where)

def check_value(o, where):
    if o.group(1) == "--cpu" and o.group(2) and o.group(2) not in ("help", "NAME", "native"):
        if o.group(2) not in cpus:
            fail("%s: --cpu=%s is not in xtc compile --cpu=help" % (where, o.group(2)))

# code blocks line by line; outside them, table rows as a whole, else each inline code span
in_block, lang = False, ""
for n, line in enumerate(lines, 1):
    where = "README.md:%d" % n
    if line.strip().startswith("```"):
        in_block, lang = (not in_block), line.strip()[3:]
        continue
    if in_block:
        if lang in ("", "sh", "bash", "shell", "console"):
            check_text(line, where)
    elif line.startswith("|"):
        check_text(" ".join(re.findall(r"`([^`]*)`", line)), where)
    else:
        for span in re.findall(r"`([^`]+)`", line):
            check_text(span, where)

# C API names
header = open(os.path.join(src, "include", "xtc.h")).read()
tree_text = []
for d in ("cli", "runtime", "codegen", "frontend", "ir", "passes", "tests", ".ci"):
    for root, _, files in os.walk(os.path.join(src, d)):
        for f in files:
            if f.endswith((".c", ".h", ".sh")) or root.endswith(".ci"):
                try:
                    tree_text.append(open(os.path.join(root, f), errors="replace").read())
                except OSError:
                    pass
tree_text = "\n".join(tree_text)
tools = set(os.listdir(os.path.join(src, "tools"))) if os.path.isdir(os.path.join(src, "tools")) else set()
for name in sorted(set(re.findall(r"(?<![\w.])(xtc_[a-z0-9_]+|Xtc[A-Z][A-Za-z0-9]*|XTC_[A-Z0-9_]+)(?![\w*])", readme))):
    checked["api"] += 1
    if re.search(r"\b%s\b" % name, header):
        continue
    if name + ".py" in tools:  # tools/xtc_safetensors.py imported as a module
        continue
    if name.startswith("XTC_") and re.search(r'getenv\("%s"\)|\$\{?%s\b' % (name, name), tree_text):
        continue
    fail("README names %s, which include/xtc.h does not declare (nor is it an environment "
         "variable the sources read)" % name)

# repository paths
TOP = r"(?:\.ci|tools|tests|examples|models|include|bench|cli|runtime|frontend|ir|passes|codegen|docs)"
for n, line in enumerate(lines, 1):
    for p in re.findall(r"(?<![\w./-])(%s/[\w./-]*)" % TOP, line):
        p = p.rstrip(".")
        checked["paths"] += 1
        if not os.path.exists(os.path.join(src, p)):
            fail("README.md:%d: %s does not exist" % (n, p))

# the Layout table against the tree's top-level folders
try:
    listed = subprocess.run(["git", "-C", src, "ls-files"], capture_output=True, text=True, check=True).stdout.split()
    tops = {f.split("/")[0] for f in listed if "/" in f}
except (OSError, subprocess.CalledProcessError):
    tops = {d for d in os.listdir(src) if os.path.isdir(os.path.join(src, d))}
tops = {d for d in tops if not d.startswith((".", "build"))}
m = re.search(r"^## Layout\n(.*?)(?=^## |\Z)", readme, re.S | re.M)
if not m:
    fail("README has no '## Layout' section")
else:
    rows = {r.strip("/") for r in re.findall(r"^\| `([^`]+)` \|", m.group(1), re.M)}
    rows = {r.split("/")[0] for r in rows}
    if rows - tops:
        fail("the Layout table lists %s, which the tree lacks" % sorted(rows - tops))
    if tops - rows:
        fail("the Layout table misses the folders %s" % sorted(tops - rows))

if len(lines) >= 400:
    fail("README.md has %d lines: keep it under 400 (history goes to bench/RESULTS.md)" % len(lines))

for f in fails:
    print("FAIL: " + f)
print("checked %(commands)d commands, %(options)d options, %(api)d API names, %(paths)d paths" % checked)
for k, v in checked.items():
    if v == 0:
        print("FAIL: no %s found in README.md: the checker no longer reads it" % k)
        fails.append(k)
sys.exit(1 if fails else 0)
PY
$py "$tmp/check.py" "$src" "$tmp" "$cmds"
