"""Which of a request's tools fits the user's question, and what the question says a call's
arguments should be (sans-I/O).

``fit_tool(question, tools) -> Tool | None`` and ``hints_for(question) -> dict[str, str]``.
This is the simulator's stand-in for a model's judgement: a few fixed rules, no draws, so the
same question and tools always give the same tool.

Rules:

- Names compare in lower case without ``_ - . :`` and spaces (``exec_command`` is
  ``ExecCommand``). A *shell* is a tool named ``Bash``, ``shell``, ``sh``, ``exec``,
  ``exec_command``, ``run_command``, ``run_shell_command``, ``terminal``, ``local_shell`` (...),
  or one whose parameters require a ``command`` or ``cmd``.
- First the question's *intent*, the first of these it shows (words in any case):

  ``fetch``   a URL (``http://`` or ``https://``): a fetch tool (``WebFetch``, ``fetch``,
              ``fetch_url``, ``web_fetch`` ...); never a shell.
  ``run``     a command in backticks and a verb ``run``, ``execute`` or ``exec``: a shell,
              running that command.
  ``read``    a verb (``read``, ``cat``, ``open``, ``show``, ``view``, ``print``, ``display``,
              ``what``, ``explain``, ``describe``, ``summarize``) and a file name (a word with an
              extension, ``main.py``, ``docs/api.md``; or ``README``, ``LICENSE``, ``Makefile``
              ...): a read tool (``Read``, ``read_file``, ``view_file``, ``cat`` ...), else a
              shell running ``cat NAME`` (``cat README*`` for a name without extension).
  ``list``    files, folders or directories (``file``, ``dir``, ``repo``, ``project`` ...) with
              ``list``, ``ls``, ``show``, ``see``, ``display``, ``tree`` or ``enumerate``, or
              plural ones (``files``) with ``what`` or ``which``: a listing tool (``LS``,
              ``list_dir``, ``list_files``, ``Glob`` ...), else a shell running ``ls``.
  ``search``  ``search``, ``grep``, ``find`` or ``locate`` and a target (a quoted string, else
              the first content word after the verb): with ``web``, ``internet`` or
              ``online``, a web search tool (``WebSearch`` ...), never a shell; else a search
              tool (``Grep``, ``search``, ``search_files`` ...), else a shell running
              ``grep -rn TARGET .``.

  The intent's own tools are tried in the order listed (``LS`` before ``Glob``), then a shell.
- When no tool serves the intent (or there is none), the *keyword rule*: the question's content
  words (``gateway.side.sim.prose``'s function words, words every tool says, ``file``, ``tool``,
  ``get`` ..., and action verbs, ``write``, ``list``, ``run`` ..., left out: the intents read
  verbs, keywords name things; a plural ``s`` dropped) against each tool's name words
  (``get_weather`` → ``weather``, ``SendMessage`` → ``message``) and the content words
  of its description's first sentence: 2 points for each name word, 1 for each description
  word. The highest score of at least 2 fits (one description word is chance: ``time`` is in
  many a description), the earlier tool on a tie. So ``"What is the weather in Paris?"``
  calls ``get_weather`` and ``"Why is the sky blue?"`` calls nothing.
- Hints (``hints_for``): what the question gives properties of well-known names:
  ``command`` / ``cmd`` (the intent's shell command, else ``ls``), ``pattern`` (the search
  target, else ``*``), ``url`` (the question's URL, else ``https://example.com``), ``query``
  (the search target, else the question), ``prompt`` (the question).
  ``gateway.side.sim.arguments`` fills required properties of those names with them.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.side.sim.prose import FUNCTION_WORDS

__all__ = ["Tool", "fit_tool", "hints_for", "is_shell", "normalised"]


def _vocabulary(words: str) -> frozenset[str]:
    return frozenset(words.split())


_URL = re.compile(r"https?://[^\s<>\"'`)\]]+")
_BACKTICKED = re.compile(r"`([^`\n]+)`")
_QUOTED = re.compile(r"[\"“`]([^\"”`\n]{1,80})[\"”`]")
_FILE = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w-]{2,}\.[A-Za-z][A-Za-z0-9]{0,7})(?![\w/-])")
_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9'+#-]*")
_NAME_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s")
_KNOWN_FILES = _vocabulary(
    "readme license licence changelog contributing authors notice makefile dockerfile "
    "gemfile procfile justfile vagrantfile jenkinsfile"
)
_SHELLS = _vocabulary(
    "bash shell sh zsh exec execcommand runcommand runshellcommand shellcommand terminal "
    "runterminalcommand runterminalcmd localshell executecommand runcmd"
)
_READ_VERBS = _vocabulary(
    "read cat open show view print display what explain describe summarize summarise"
)
_LIST_VERBS = _vocabulary("list ls show see display tree enumerate")
_LIST_NOUNS = _vocabulary(
    "file files folder folders directory directories dir dirs repo repository project "
    "workspace tree"
)
_PLURAL_NOUNS = _vocabulary("files folders directories dirs")
_SEARCH_VERBS = _vocabulary("search grep find locate")
_SEARCH_FILLER = _vocabulary(
    "file files code codebase repo repository project occurrences occurrence usages usage "
    "uses definition definitions defined reference references mention mentions word string "
    "text all every web internet online"
)
_WEB = _vocabulary("web internet online")
_RUN_VERBS = _vocabulary("run execute exec")
_GENERIC = _vocabulary(
    "file files tool tools get set use using call function new current given data content "
    "output input result value "
    # actions: what is acted on names the tool, not the verb ("write a poem" is no Write call)
    "write edit create delete remove update list read run make send stop start show find "
    "search add change open close view check report do done"
)
_ENOUGH = 2  # a name word, or two description words: one description word is chance
_READERS = ("read", "readfile", "viewfile", "openfile", "cat", "fileread")
_LISTERS = ("ls", "listdir", "listdirectory", "listfiles", "glob", "findfiles")
_SEARCHERS = ("grep", "search", "searchfiles", "searchcode", "codesearch", "ripgrep", "rg",
              "findinfiles")  # fmt: skip
_WEB_SEARCHERS = ("websearch", "searchweb", "webbrowse", "googlesearch", "bingsearch")
_FETCHERS = ("webfetch", "fetch", "fetchurl", "urlfetch", "fetchpage", "readurl", "browse")


@dataclass(frozen=True, slots=True)
class Tool:
    """A function tool of the request: its name, description and parameters schema."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Intent:
    """What the question asks to be done with tools."""

    tools: tuple[str, ...]  # normalised names of the tools made for it, preferred first
    command: str | None  # what a shell runs for it; None: no shell will do
    target: str | None = None  # what to search for
    url: str | None = None


def normalised(name: str) -> str:
    """A tool name as the rules compare it."""
    return re.sub(r"[\s_.:-]", "", name).lower()


def is_shell(tool: Tool) -> bool:
    """A tool that runs shell commands (rules in the module docstring)."""
    required = tool.parameters.get("required")
    needs = set(required) if isinstance(required, list) else set()
    return normalised(tool.name) in _SHELLS or bool(needs & {"command", "cmd"})


def fit_tool(question: str, tools: Sequence[Tool]) -> Tool | None:
    """The tool that fits ``question``, if one does (rules in the module docstring)."""
    intent = _intent(question)
    served = _serving(intent, tools) if intent is not None else None
    return served or _by_keywords(question, tools)


def hints_for(question: str) -> dict[str, str]:
    """Values ``question`` gives properties of well-known names."""
    intent = _intent(question)
    command = intent.command if intent is not None and intent.command else "ls"
    target = intent.target if intent is not None else None
    url = intent.url if intent is not None else None
    return {
        "command": command,
        "cmd": command,
        "pattern": target or "*",
        "url": url or "https://example.com",
        "query": target or question or "sim",
        "prompt": question or "sim",
    }


def _serving(intent: _Intent, tools: Sequence[Tool]) -> Tool | None:
    """The intent's own tool, in its order of preference, else a shell if one will do."""
    by_name = {normalised(tool.name): tool for tool in reversed(tools)}  # the first wins
    for name in intent.tools:
        if name in by_name:
            return by_name[name]
    if intent.command is not None:
        return next((tool for tool in tools if is_shell(tool)), None)
    return None


def _intent(question: str) -> _Intent | None:
    words = [w.lower() for w in _WORD.findall(question)]
    said = set(words)
    url = _URL.search(question)
    if url:
        return _Intent(_FETCHERS, None, url=url.group(0).rstrip(".,;:!?"))
    command = _BACKTICKED.search(question)
    if command and said & _RUN_VERBS:
        return _Intent((), command.group(1).strip())
    name = _file_name(question)
    if name and said & _READ_VERBS:
        pattern = "*" if "." not in name else ""  # README: README.md, README.rst ...
        return _Intent(_READERS, f"cat {shlex.quote(name)}{pattern}")
    if _lists(said):
        return _Intent(_LISTERS, "ls")
    target = _search_target(question, words)
    if target and said & _WEB:
        return _Intent(_WEB_SEARCHERS, None, target=target)
    if target:
        return _Intent(_SEARCHERS, f"grep -rn {shlex.quote(target)} .", target=target)
    return None


def _lists(said: set[str]) -> bool:
    """Files, folders or directories with a listing verb, or plural ones asked about."""
    asked = bool(said & {"what", "which"} and said & _PLURAL_NOUNS)
    return bool(said & _LIST_NOUNS) and (bool(said & _LIST_VERBS) or asked)


def _file_name(question: str) -> str | None:
    found = _FILE.search(_URL.sub(" ", question))
    if found:
        return found.group(1)
    return next((w for w in _WORD.findall(question) if w.lower() in _KNOWN_FILES), None)


def _search_target(question: str, words: list[str]) -> str | None:
    """What a search question looks for: a quoted string, else the first content word after
    the search verb; ``None`` if the question does not search."""
    at = next((i for i, word in enumerate(words) if word in _SEARCH_VERBS), None)
    if at is None:
        return None
    quoted = _QUOTED.search(question)
    if quoted:
        return quoted.group(1)
    after = (w for w in _WORD.findall(question)[at + 1 :] if _is_content(w.lower()))
    return next((w for w in after if w.lower() not in _SEARCH_FILLER), None)


def _by_keywords(question: str, tools: Sequence[Tool]) -> Tool | None:
    wanted = _keywords(_WORD.findall(question))
    best, best_score = None, _ENOUGH - 1
    for tool in tools:
        named = _keywords(_NAME_WORD.findall(tool.name))
        described = _keywords(_WORD.findall(_first_sentence(tool.description)))
        score = 2 * len(wanted & named) + len(wanted & described)
        if score > best_score:
            best, best_score = tool, score
    return best


def _keywords(words: list[str]) -> set[str]:
    return {_stem(word.lower()) for word in words if _is_content(word.lower())} - _GENERIC


def _is_content(word: str) -> bool:
    return word not in FUNCTION_WORDS and word not in _GENERIC and not word.isdigit()


def _stem(word: str) -> str:
    """A plural's singular, roughly (``files`` → ``file``, ``directories`` → ``directory``)."""
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        return word[:-1]
    return word


def _first_sentence(description: str) -> str:
    text = description.strip().lstrip("-*# ").strip()
    line = text.split("\n", 1)[0]
    return _SENTENCE_END.split(line, maxsplit=1)[0]
