#!/usr/bin/env bash
# The documentation, checked against the code (no root, no network, a few seconds):
#  1. every `cni-guard-agent COMMAND ... --flag` shown in README.md, SECURITY.md,
#     CONTRIBUTING.md, docs/**/*.md and the chart's README.md (code blocks with their `\` continuations joined, and inline code; also
#     `/cni-guard-agent COMMAND` as run in a pod, and an inline span that starts with `install`,
#     `keep`, `check` or `uninstall` and a flag) names a flag that `cni-guard-agent COMMAND
#     --help` of the release binary lists; `cni-guard-agent --flag` one that
#     `cni-guard-agent --help` lists; every flag written alone in backticks in
#     docs/reference/{cli,configuration}.md is some command's; and no `cni-guard COMMAND` is
#     shown (the plugin has no commands: they are the agent's);
#  2. every relative link between these files (and to any file of the repository) resolves,
#     and every #anchor is a heading (GitHub's rule, duplicates numbered) of its target;
#  3. every `cni-guard-agent X.Y.Z (commit` shown has the crate's version;
#  4. docs/reference/cli.md names every flag that any command's --help lists;
#  5. the pages for operators (README.md, docs/ outside development/, the chart's README) use
#     no internal words: the project's history ("issue 28", "the seed"), its test rig ("the test
#     node", "this machine", "stand-in", "the suites") or its test scripts' paths;
#  6. the commands they show match the files: every repository path in a command or code span
#     (deploy/..., scripts/...) exists, `docker build -f FILE` names the Containerfile and builds
#     from the repository's root (`.`), `kubectl apply -k DIR` names a kustomization, and an
#     image or tarball of cni-guard with a version (`cni-guard:0.2.0`) has the crate's.
# Any failure is printed with its file and line, and the script exits 1.
set -euo pipefail
cd "$(dirname "$0")/../.."

cargo build --release --locked -p cni-guard -p cni-guard-agent
BIN=${CARGO_TARGET_DIR:-target}/release/cni-guard-agent
[ -x "$BIN" ] || { echo "15-docs: FAIL: no binary at $BIN" >&2; exit 1; }

HELP=$(mktemp -d)
trap 'rm -rf "$HELP"' EXIT
"$BIN" --help >"$HELP/top"
"$BIN" --version >"$HELP/version"
for cmd in install keep check uninstall; do
  "$BIN" "$cmd" --help >"$HELP/$cmd"
done
crate=$(sed -n 's/^version = "\(.*\)"$/\1/p' plugin/Cargo.toml)

python3 - "$HELP" "$crate" README.md SECURITY.md CONTRIBUTING.md deploy/helm/cni-guard/README.md \
  $(find docs -name '*.md' | sort) <<'PY'
import os, re, sys

help_dir, crate, files = sys.argv[1], sys.argv[2], sys.argv[3:]
COMMANDS = ["install", "keep", "check", "uninstall"]
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")

def flags_of(name):
    return set(FLAG.findall(open(os.path.join(help_dir, name)).read())) | {"--help"}

known = {c: flags_of(c) for c in COMMANDS}
known_top = flags_of("top") | {"--version"}
every_flag = set().union(*known.values())
failures = []
checked = {"flags": 0, "links": 0, "anchors": 0}

def fail(path, line, what):
    failures.append(f"{path}:{line}: {what}")

def anchors_of(text):
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to '-', repeats -1, -2."""
    seen, out = {}, set()
    in_code = False
    for line in text.splitlines():
        if re.match(r"^\s*(```|~~~)", line):
            in_code = not in_code
            continue
        m = None if in_code else re.match(r"^#{1,6} +(.+?) *#*$", line)
        if not m:
            continue
        h = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1))  # a link keeps its text
        a = re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
        n = seen.get(a, 0)
        seen[a] = n + 1
        out.add(a if n == 0 else f"{a}-{n}")
    for m in re.finditer(r"<a (?:id|name)=\"([^\"]+)\"", text):
        out.add(m.group(1))
    return out

def command_segments(path, lines):
    """(line number, command, rest) for every cni-guard command shown: code blocks and spans."""
    in_code = False
    i = 0
    while i < len(lines):
        line = lines[i]
        if re.match(r"^\s*(```|~~~)", line):
            in_code = not in_code
            i += 1
            continue
        texts = []
        if in_code:
            # Join `\` continuations.
            text, j = line, i
            while text.rstrip().endswith("\\") and j + 1 < len(lines):
                j += 1
                text = text.rstrip()[:-1] + " " + lines[j]
            texts.append(text)
        else:
            texts.extend(re.findall(r"`([^`]+)`", line))
            # An inline span that starts with a command and a flag: `keep --metrics-address`.
            for span in re.findall(r"`([^`]+)`", line):
                m = re.match(r"^(install|keep|check|uninstall)( +--.*)$", span)
                if m:
                    yield i + 1, m.group(1), m.group(2)
        for text in texts:
            # An invocation: the binary (cni-guard-agent, or a path ending in /cni-guard-agent)
            # where a command starts, not a word inside another command (`kubectl -n cni-guard
            # ...`) or a value (`--cache-dir=/var/lib/cni/cni-guard --capability=...`). The
            # plugin (cni-guard) shown with a command is a mistake: it has none.
            for m in re.finditer(r"(?:^\s*|\$\s+|--\s+|&&\s+|;\s*|\|\s*|\(|\bsudo\s+|\bexec\s+)"
                                 r"(?:[\w.-]*/)*cni-guard(-agent)? +(--[a-z-]+|[a-z]+)(?![\w:-])(.*)", text):
                agent, word, rest = m.group(1), m.group(2), m.group(3)
                if not agent:
                    if word in COMMANDS or word in ("--version", "--help"):
                        yield i + 1, "plugin", word
                    continue
                if word.startswith("--"):
                    yield i + 1, None, word + rest
                elif word in COMMANDS:
                    yield i + 1, word, rest
        i += 1

for path in files:
    text = open(path).read()
    lines = text.splitlines()
    # 1. commands and flags
    for lineno, cmd, rest in command_segments(path, lines):
        if cmd == "plugin":
            fail(path, lineno, f"`cni-guard {rest}`: the plugin has no commands; the agent is `cni-guard-agent {rest}`")
            continue
        rest = re.split(r"\s[|;#(]|&&|\|\||`|\s--\s", rest)[0]
        for flag in FLAG.findall(rest):
            checked["flags"] += 1
            ok = flag in (known[cmd] if cmd else known_top)
            if not ok:
                fail(path, lineno, f"`cni-guard-agent {cmd or ''} {flag}`: no such flag in `cni-guard-agent {cmd or ''} --help`".replace("  ", " "))
    if re.search(r"docs/reference/(cli|configuration)\.md$", path):
        for lineno, line in enumerate(lines, 1):
            for span in re.findall(r"`(--[a-z][a-z0-9-]*)(?:[ =][^`]*)?`", line):
                checked["flags"] += 1
                if span not in every_flag and span not in known_top:
                    fail(path, lineno, f"`{span}` is a flag of no command (`cni-guard-agent COMMAND --help`)")
    # 3. the version shown
    for lineno, line in enumerate(lines, 1):
        for v in re.findall(r"cni-guard-agent (\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?) \(commit", line):
            if v != crate:
                fail(path, lineno, f"shows version {v}; the crate is {crate}")
    # 2. links
    in_code = False
    for lineno, line in enumerate(lines, 1):
        if re.match(r"^\s*(```|~~~)", line):
            in_code = not in_code
            continue
        if in_code:
            continue
        line = re.sub(r"`[^`]*`", "", line)
        for target in re.findall(r"\]\(<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\)", line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue  # http:, https:, mailto:
            checked["links"] += 1
            page, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(path), page)) if page else path
            if not os.path.exists(dest):
                fail(path, lineno, f"link {target}: {dest} does not exist")
                continue
            if anchor:
                checked["anchors"] += 1
                if not dest.endswith(".md") or os.path.isdir(dest):
                    fail(path, lineno, f"link {target}: an anchor into {dest}, which is no markdown file")
                elif anchor not in anchors_of(open(dest).read()):
                    fail(path, lineno, f"link {target}: no heading #{anchor} in {dest}")

# 5. and 6. operators' pages: no internal words; commands that match the files.
INTERNAL = [
    (r"\bseed(?:'s|-fix)?\b", "the seed"), (r"\(?\bissue \d+\b", "an issue number"),
    (r"\bstand-in\b", "a test stand-in"), (r"\bthis machine\b", "this machine"),
    (r"\bthe test node\b", "the test node"), (r"\bthe suites?\b", "the suites"),
    (r"\b(?:not )?(?:run|measured) here\b", "here"),
    (r"(?<![\w/])(?:scripts/test\.d/|conformance/|agent/tests/|plugin/tests/)", "a test's path"),
]
def operators(path):
    return path == "README.md" or path.startswith("deploy/") or (
        path.startswith("docs/") and not path.startswith("docs/development/"))
for path in files:
    if not operators(path):
        continue
    lines = open(path).read().splitlines()
    in_code = False
    for lineno, line in enumerate(lines, 1):
        if re.match(r"^\s*(```|~~~)", line):
            in_code = not in_code
            continue
        prose = re.sub(r"\]\([^)]*\)", "]", line)  # link targets are addresses, not words
        for pattern, what in INTERNAL:
            m = re.search(pattern, prose, re.I)
            if m:
                fail(path, lineno, f"{what} ({m.group(0)!r}): an internal word on a page for operators")
        joined, j = line, lineno
        while in_code and joined.rstrip().endswith("\\") and j < len(lines):
            joined, j = joined.rstrip()[:-1] + " " + lines[j], j + 1
        spans = [joined] if in_code else re.findall(r"`([^`]+)`", line)
        for span in spans:
            for ref in re.findall(r"(?<![\w./-])((?:deploy|scripts)/[\w./-]*[\w/])", span):
                if not os.path.exists(ref):
                    fail(path, lineno, f"`{ref}`: no such file or folder in the repository")
            m = re.search(r"docker build (.*)", span)
            if m:
                args = m.group(1).split()
                given = args[args.index("-f") + 1] if "-f" in args else None
                if given != "deploy/image/Containerfile" or args[-1] != ".":
                    fail(path, lineno, "`docker build` must take -f deploy/image/Containerfile and the repository's root (.) as its context")
            for d in re.findall(r"kubectl (?:apply|delete|kustomize)(?: -k)? (deploy/[\w/-]+)", span):
                if not os.path.exists(os.path.join(d, "kustomization.yaml")):
                    fail(path, lineno, f"`{d}` is no kustomization")
            for v in re.findall(r"cni-guard[:-](\d+\.\d+\.\d+(?:-[0-9A-Za-z.]+)?)\b", span):
                if v != crate:
                    fail(path, lineno, f"cni-guard {v} shown; the crate is {crate}")

# 4. the CLI reference lists every flag of every command.
cli = "docs/reference/cli.md"
if cli in files:
    documented = set(re.findall(r"`(--[a-z][a-z0-9-]*)", open(cli).read()))
    for cmd in COMMANDS:
        for flag in sorted(known[cmd] - documented):
            checked["flags"] += 1
            fail(cli, 0, f"`cni-guard-agent {cmd} --help` lists {flag}, which this page does not")
else:
    fail(cli, 0, "missing")

for f in failures:
    print(f"15-docs: FAIL: {f}", file=sys.stderr)
print(f"15-docs: {len(files)} files; {checked['flags']} flags, {checked['links']} links, "
      f"{checked['anchors']} anchors checked; {len(failures)} failures")
if failures:
    print(f"15-docs: FAILED: {len(failures)} problems in the documentation (above)", file=sys.stderr)
    sys.exit(1)
PY
echo "15-docs: the commands, flags and links of README.md and docs/ are the binary's and resolve; the operators' pages use no internal words"
