"""The documentation stays true where it names commands and links: every `koordbus …` command in README.md and
docs/*.md parses with the real argument parser (koordbus.cli.build_parser), and every relative link points to a file
(and, for a `#anchor`, a heading) that exists.

Which text is a command:
* in a fenced code block (except those marked `text`, `yaml`, `json` or `console` output), each line, with its
  backslash continuations, cut into commands at `&&`, `||`, `;` and `|` and stripped of `# comments` and
  redirections (`< in.json`, `> out.json`); a command whose first word after any `VAR=value` prefixes is
  `koordbus` or ends in `/koordbus` (`.venv/bin/koordbus`) is checked;
* every inline code span that starts with `koordbus ` (in a table, `\\|` is a `|`).

How a synopsis is read (the notation of `--help`, see docs/operations.md):
* `[…]` is optional and is checked present; `[a | b]` checks each alternative in turn;
* `{a,b,c}` as a whole word checks each value in turn;
* a placeholder is replaced by `1` (which every argument type here accepts): a word in capitals (`URL`, `NODE`, `F`),
  or `<name>`; a `…` after a word means "more of the same" and is dropped;
* a `…` that ends a command names a family (`koordbus quota …`): the words before it must be subcommands, checked
  with `--help` appended (argparse answers help only for subcommands that exist), and may carry no flag.

argparse reports an error by exiting: SystemExit (other than 0 from `--help`) is a failure naming file:line. The
parser is the real one with one thing taken away: abbreviated flags (`--simulate-node` for `--simulate-nodes`), which
argparse would accept but a page should not teach.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from koordbus.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

OUTPUT_BLOCKS = {"text", "yaml", "json", "console"}
FENCE = re.compile(r"^```(\w*)\s*$")
CODE_SPAN = re.compile(r"(?<!`)`([^`]+)`(?!`)")
PLACEHOLDER = re.compile(r"[A-Z][A-Z0-9_]*")
ANGLE_PLACEHOLDER = re.compile(r"<[a-z][\w-]*>")
CHOICES = re.compile(r"\{[\w.-]+(?:,[\w.-]+)+\}")
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
SEPARATORS = {"&&", "||", ";", "|", "&", "(", ")"}
REDIRECTS = {"<", ">", ">>", "2>", "&>"}
ELLIPSIS = {"…", "..."}
DUMMY = "1"


@dataclass(frozen=True)
class DocCommand:
    where: str  # file:line
    words: tuple[str, ...]  # the words after `koordbus`, synopsis marks (`[`, `|`, `]`) as words of their own


def _relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _fenced_lines(lines: list[str]) -> Iterator[tuple[int, str]]:
    """(line number, logical line) of each line in a fenced code block that is not output; continuations joined."""
    fence: str | None = None
    pending, start = "", 0
    for number, line in enumerate(lines, 1):
        match = FENCE.match(line.strip()) if line.lstrip().startswith("```") else None
        if match and fence is None:
            fence = match.group(1) or "none"
            continue
        if match and fence is not None:
            fence = None
            continue
        if fence is None or fence in OUTPUT_BLOCKS:
            continue
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        yield start, pending + line
        pending = ""


def _prose(lines: list[str]) -> list[tuple[int, str]]:
    """The lines outside fenced code blocks (where inline code spans live)."""
    out, in_fence = [], False
    for number, line in enumerate(lines, 1):
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
            continue
        if not in_fence:
            out.append((number, line))
    return out


def _prose_matches(
    lines: list[str], pattern: re.Pattern[str], *, blank_code: bool = False
) -> Iterator[tuple[int, str]]:
    """(line number, group 1) of each match in the prose, read as one text: a span or link may wrap onto the next
    line. With blank_code, matches inside inline code spans do not count."""
    prose = _prose(lines)
    text = "\n".join(line for _, line in prose)
    if blank_code:
        text = CODE_SPAN.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
    starts = list(itertools.accumulate(len(line) + 1 for _, line in prose))  # where each next line starts
    for match in pattern.finditer(text):
        yield prose[next(i for i, start in enumerate(starts) if start > match.start())][0], match.group(1)


def _lex(text: str) -> list[str]:
    """Shell words, with `[`, `]`, `|`, `&&`, `;`, `<`, `>` … as words of their own; comments dropped."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars="();<>|&[]")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    words: list[str] = []
    for word in lexer:
        if set(word) <= set("[]") and len(word) > 1:  # `]]` closes two groups
            words.extend(word)
        else:
            words.append(word)
    return words


def _commands(words: list[str]) -> Iterator[list[str]]:
    """Split at shell separators outside `[…]` (inside one a `|` separates alternatives), drop redirections."""
    depth, skip_next = 0, False
    current: list[str] = []
    for word in words:
        if skip_next:
            skip_next = False
            continue
        if word == "[":
            depth += 1
        elif word == "]":
            depth -= 1
        if depth == 0 and word in SEPARATORS:
            yield current
            current = []
        elif depth == 0 and word in REDIRECTS:
            skip_next = True
        else:
            current.append(word)
    yield current


def _koordbus_words(command: list[str]) -> list[str] | None:
    """The words after `koordbus` when this command runs koordbus (after any VAR=value prefixes), else None."""
    rest = list(itertools.dropwhile(lambda w: ASSIGNMENT.match(w) is not None, command))
    if rest and (rest[0] == "koordbus" or rest[0].endswith("/koordbus")):
        return rest[1:]
    return None


def _koordbus_commands(text: str) -> Iterator[tuple[str, ...]]:
    """The words after `koordbus` of each koordbus command in a line of shell (or a code span)."""
    for command in _commands(_lex(ANGLE_PLACEHOLDER.sub(DUMMY, text))):
        words = _koordbus_words(command)
        if words is not None:
            yield tuple(words)


def doc_commands() -> list[DocCommand]:
    found: list[DocCommand] = []
    for path in DOCS:
        lines = path.read_text(encoding="utf-8").splitlines()
        for number, line in _fenced_lines(lines):
            found += [DocCommand(f"{_relative(path)}:{number}", words) for words in _koordbus_commands(line)]
        for number, code in _prose_matches(lines, CODE_SPAN):
            span = " ".join(code.split())
            if span.startswith("koordbus "):
                spans = _koordbus_commands(span.replace("\\|", "|"))
                found += [DocCommand(f"{_relative(path)}:{number}", words) for words in spans]
    return found


def _expand(words: list[str]) -> list[list[str]]:
    """Every variant of a synopsis: optional groups present, one alternative of each `[a | b]` and `{a,b}` at a time."""

    def sequence(position: int) -> tuple[list[list[str]], int]:
        variants: list[list[str]] = [[]]
        while position < len(words) and words[position] not in ("]", "|"):
            word = words[position]
            if word == "[":
                options: list[list[str]] = []
                while True:
                    inner, position = sequence(position + 1)
                    options.extend(inner)
                    if position >= len(words) or words[position] == "]":
                        break  # at `]`; `|` goes round again for the next alternative
                position += 1
                variants = [v + o for v in variants for o in options]
                continue
            if CHOICES.fullmatch(word):
                choices = word[1:-1].split(",")
                variants = [[*v, c] for v in variants for c in choices]
            elif word in ELLIPSIS:
                pass  # "more of the same"
            elif PLACEHOLDER.fullmatch(word):
                variants = [[*v, DUMMY] for v in variants]
            else:
                variants = [[*v, word] for v in variants]
            position += 1
        return variants, position

    variants, position = sequence(0)
    if position != len(words):
        raise ValueError(f"unbalanced `[`/`]` or `|` outside a group at word {position + 1}")
    return variants


def _strict_parser() -> argparse.ArgumentParser:
    """koordbus's parser, built once, with abbreviations of long flags refused at every level."""
    parser = build_parser()
    pending = [parser]
    while pending:
        current = pending.pop()
        current.allow_abbrev = False
        for action in current._actions:
            if isinstance(action, argparse._SubParsersAction):
                pending.extend(action.choices.values())
    return parser


PARSER = _strict_parser()


def _check(parser: argparse.ArgumentParser, command: DocCommand) -> str | None:
    """None when the command parses, else why not."""
    words = list(command.words)
    family = bool(words) and words[-1] in ELLIPSIS
    if family:
        words = words[:-1]
        if any(w.startswith("-") for w in words):
            return "a family (a `…` at the end) names subcommands only: write the command with its flags whole"
    try:
        variants = _expand(words)
    except ValueError as e:
        return str(e)
    for variant in variants:
        argv = [*variant, "--help"] if family else variant
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                parser.parse_args(argv)
        except SystemExit as e:
            if family and e.code == 0:
                continue
            if e.code == 0 and "--help" in variant:
                continue
            error = out.getvalue().strip().splitlines()
            return f"`koordbus {shlex.join(variant)}`: {error[-1] if error else f'exit {e.code}'}"
        if family:
            return f"`koordbus {shlex.join(variant)} --help` did not answer with help"
    return None


COMMANDS = doc_commands()


def test_the_docs_name_commands() -> None:
    # guards the extraction itself: a parser change that finds nothing would pass everything below
    assert len(COMMANDS) > 50
    assert any(c.where.startswith("README.md") for c in COMMANDS)


def test_every_documented_koordbus_command_parses() -> None:
    failures = [f"{c.where}: {why}" for c in COMMANDS if (why := _check(PARSER, c)) is not None]
    assert not failures, "documented commands that koordbus's parser refuses:\n" + "\n".join(failures)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("koordbus quotas tree", "invalid choice"),
        ("koordbus up --simulate-node 5", "unrecognized arguments"),
        ("koordbus quota tree --api URL", "unrecognized arguments"),  # --api belongs before the verb
        ("koordbus events [--api URL] {tail,types} [--type T]", "unrecognized arguments"),  # types takes no filter
        ("koordbus service nodemetrics …", "invalid choice"),
        ("koordbus up --port …", "flags whole"),
    ],
)
def test_a_wrong_command_is_reported(text: str, error: str) -> None:
    [words] = _koordbus_commands(text)
    why = _check(PARSER, DocCommand("x.md:1", words))
    assert why is not None and error in why


def test_the_synopsis_notation_expands() -> None:
    words = _lex(
        "agent [--dry-run | --apply] [--kubelet-pods-url U [--kubelet-ca-file F | --kubelet-insecure]] -o {a,b}"
    )
    variants = _expand(words)
    assert len(variants) == 8
    assert ["agent", "--apply", "--kubelet-pods-url", "1", "--kubelet-insecure", "-o", "b"] in variants


def test_commands_are_found_in_blocks_and_spans() -> None:
    texts = {shlex.join(["koordbus", *c.words]) for c in COMMANDS}
    assert "koordbus quota import -f eq.yaml --dry-run" in texts  # after `&&`, its comment dropped
    assert "koordbus calc arbitrate" in texts  # its `< round.json` dropped
    assert "koordbus scheduler state NODE" in texts  # a span over two lines, its `> state.json` dropped
    assert any(t.startswith("koordbus agent --nats-url nats://nats.koordbus:4222") and "--dry-run" in t for t in texts)


# --- links ---------------------------------------------------------------------------------------------------------

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")  # the text may wrap onto the next line
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, code marks and punctuation but `-` and `_` dropped, spaces `-`."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    for _, line in _prose(path.read_text(encoding="utf-8").splitlines()):
        match = HEADING.match(line)
        if match:
            base = _anchor(match.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            anchors.add(base if count == 0 else f"{base}-{count}")
    return anchors


def test_every_relative_link_points_to_something_that_exists() -> None:
    broken = []
    for path in DOCS:
        for number, target in _prose_matches(path.read_text(encoding="utf-8").splitlines(), LINK, blank_code=True):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            linked = (path.parent / file_part).resolve() if file_part else path
            if not linked.exists():
                broken.append(f"{_relative(path)}:{number}: {target}: no such file")
            elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
                broken.append(f"{_relative(path)}:{number}: {target}: no such heading in {linked.name}")
    assert not broken, "broken links:\n" + "\n".join(broken)
