"""A copy-heavy chat workload for prompt-lookup speculation (issue 56), deterministic by seed.

Documents are REAL text that this Python installation ships: the standard library's top-level modules
(`*.py`), and the Markdown files and package descriptions (`*.dist-info/METADATA`) under site-packages.
Nothing is downloaded. The candidate files are listed, sorted by a stable key, and drawn by the seed; each
document is one chunk of a file: whole lines from a line drawn by the seed, about `doc_tokens` tokens of
the served model's tokenizer, an exact substring of the file (so a test can find it there).

Each question is a chat turn whose user message is the document followed by an instruction to copy it:
quote a part, continue it from a given point, rename an identifier, fix a typo put into it, or reformat it.
A greedy model's answer then largely repeats the prompt, which is what n-gram prompt lookup drafts from.
The document comes first in the message, so questions over one document share its prefix."""

from __future__ import annotations

import hashlib
import keyword
import random
import re
import sysconfig
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

from kvloop.engine.bench.workloads import RequestSpec, Workload

TASKS = ("quote", "continue", "rename", "typo", "reformat")
SOURCES = ("stdlib-py", "site-md", "site-metadata")
MAX_FILE_CHARS = 200_000  # a longer file is read up to here: one chunk needs a few KB
_IDENT = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]{3,}\b")
_WORD = re.compile(r"\b[a-z]{6,}\b")
_COMMON = frozenset(keyword.kwlist) | {
    "self",
    "None",
    "True",
    "False",
    "return",
    "import",
    "from",
    "that",
    "this",
    "with",
    "should",
    "would",
    "there",
    "their",
    "which",
}


class TextTokenizer(Protocol):
    """What the workload needs of the served model's tokenizer (kvloop's Tokenizer has it)."""

    backend: object  # a `tokenizers.Tokenizer`: encode(text) with character offsets

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]: ...


@dataclass(frozen=True)
class CopyParams:
    num_docs: int = 4
    doc_tokens: int = 384  # the chunk's length in tokens (lines are kept whole: a little under this)
    questions_per_doc: int = 5  # tasks taken in turn from TASKS, starting at a seeded one
    answer_tokens: int = 128
    seed: int = 0
    sources: tuple[str, ...] = SOURCES
    system: str = "You are a careful assistant. When asked to copy text, copy it exactly."


@dataclass(frozen=True)
class CopyDoc:
    """One document: where in which real file it comes from."""

    doc_id: str
    source: str  # one of SOURCES
    path: str  # relative to its root (the stdlib or site-packages), the same on every machine with it
    root: str  # the absolute root on this machine
    start_char: int
    text: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    def describe(self) -> dict:
        return {
            "doc_id": self.doc_id,
            "source": self.source,
            "path": self.path,
            "root": self.root,
            "start_char": self.start_char,
            "chars": len(self.text),
            "sha256": self.sha256,
        }


def source_roots() -> dict[str, Path]:
    paths = sysconfig.get_paths()
    return {
        "stdlib-py": Path(paths["stdlib"]),
        "site-md": Path(paths["purelib"]),
        "site-metadata": Path(paths["purelib"]),
    }


def candidate_files(sources: tuple[str, ...] = SOURCES) -> list[tuple[str, str]]:
    """(source, path relative to its root), sorted: the draw's population, independent of listing order."""
    roots = source_roots()
    out: list[tuple[str, str]] = []
    for src in sources:
        root = roots[src]
        if src == "stdlib-py":
            files = root.glob("*.py")
        elif src == "site-md":
            files = (
                p
                for p in root.rglob("*.md")
                if "licenses" not in p.parts and not p.name.upper().startswith("LICENSE")
            )
        elif src == "site-metadata":
            files = root.glob("*.dist-info/METADATA")
        else:
            raise ValueError(f"unknown source {src!r} (one of {', '.join(SOURCES)})")
        out += [(src, str(p.relative_to(root))) for p in files if p.is_file()]
    return sorted(out)


def read_text(root: Path, rel: str) -> str | None:
    try:
        return (root / rel).read_text(encoding="utf-8")[:MAX_FILE_CHARS]
    except (OSError, UnicodeDecodeError):
        return None


def chunk(text: str, tokenizer: TextTokenizer, doc_tokens: int, rng: random.Random) -> tuple[int, str] | None:
    """(start char, chunk) of about `doc_tokens` tokens of whole lines from a line drawn by `rng`; None when
    the file is too short for one."""
    offsets = tokenizer.backend.encode(text, add_special_tokens=False).offsets
    if len(offsets) < doc_tokens + 16:
        return None
    line_starts = [0] + [m.end() for m in re.finditer("\n", text)]
    last_start = offsets[len(offsets) - doc_tokens][0]  # a chunk starting after it would be short
    starts = [s for s in line_starts if s <= last_start and s < len(text)]
    start = rng.choice(starts)
    first = next(i for i, (a, _) in enumerate(offsets) if a >= start)
    end = offsets[min(first + doc_tokens, len(offsets)) - 1][1]
    cut = text.rfind("\n", start, end)
    body = text[start : cut + 1 if cut > start else end]
    return (start, body) if body.strip() and body.count("\n") >= 3 else None


def pick_docs(p: CopyParams, tokenizer: TextTokenizer) -> list[CopyDoc]:
    """`num_docs` documents drawn by the seed from the sorted candidates, the sources in turn (files too short
    for a chunk are passed over)."""
    rng = random.Random(f"copy-docs:{p.seed}")
    files = candidate_files(p.sources)
    if not files:
        raise RuntimeError("no candidate documents found under the stdlib or site-packages")
    roots = source_roots()
    by_source = {src: [f for f in files if f[0] == src] for src in p.sources}
    for fs in by_source.values():
        rng.shuffle(fs)
    # the sources take turns, so code and prose both appear however many files each has
    turns = [
        fs[i] for i in range(max(map(len, by_source.values()))) for fs in by_source.values() if i < len(fs)
    ]
    docs: list[CopyDoc] = []
    for src, rel in turns:
        if len(docs) == p.num_docs:
            break
        text = read_text(roots[src], rel)
        got = chunk(text, tokenizer, p.doc_tokens, rng) if text else None
        if got is not None:
            docs.append(CopyDoc(f"d{len(docs)}", src, rel, str(roots[src]), got[0], got[1]))
    if len(docs) < p.num_docs:
        raise RuntimeError(f"only {len(docs)} of {p.num_docs} documents of {p.doc_tokens} tokens found")
    return docs


def _identifier(text: str) -> str | None:
    counts = Counter(w for w in _IDENT.findall(text) if w not in _COMMON)
    return min(counts, key=lambda w: (-counts[w], w)) if counts else None  # most frequent, ties by name


def _with_typo(text: str, rng: random.Random) -> tuple[str, str, str] | None:
    """The text with one word's two middle letters swapped: (text, wrong word, right word)."""
    words = [m for m in _WORD.finditer(text) if m.group()[2] != m.group()[3]]
    if not words:
        return None
    m = rng.choice(words)
    w = m.group()
    wrong = w[:2] + w[3] + w[2] + w[4:]
    return text[: m.start()] + wrong + text[m.end() :], wrong, w


@dataclass(frozen=True)
class Question:
    shown: str  # the document as the message shows it
    ask: str  # the instruction after it
    task: str  # the task given (rename and typo fall back to reformat)
    answer_start: str  # the assistant's first line, already in the prompt: the answer is under way


def _first_line(text: str) -> str:
    return next((x for x in text.splitlines() if x.strip()), "")


def instruction(task: str, doc: CopyDoc, rng: random.Random) -> Question:
    """One task over one document. The answer's first line is given (an assistant prefill, as chat clients
    do to steer a format): a small model then goes on copying instead of describing the text."""
    lines = doc.text.splitlines()
    if task in ("quote", "continue"):
        a = rng.randrange(0, max(1, len(lines) // 2))
        while a < len(lines) - 1 and not lines[a].strip():
            a += 1
        if task == "quote":
            return Question(doc.text, f"Quote the text above exactly, starting from the line:\n{lines[a]}",
                            task, lines[a])
        head = "\n".join(lines[a : a + 3])
        return Question(doc.text, "Continue the text above from these lines, copying what follows them:\n"
                        + head, task, head)
    if task == "rename":
        name = _identifier(doc.text)
        if name is not None:
            new = f"{name}_renamed"
            return Question(doc.text, f"Rewrite the text above with every `{name}` renamed to `{new}`. "
                            "Change nothing else.", task,
                            re.sub(rf"\b{re.escape(name)}\b", new, _first_line(doc.text)))
        task = "reformat"
    if task == "typo":
        typo = _with_typo(doc.text, rng)
        if typo is not None:
            shown, wrong, _ = typo
            return Question(shown, f"The text above misspells a word as `{wrong}`. Rewrite the whole text "
                            "with it fixed.", task, _first_line(doc.text))
        task = "reformat"
    if task == "reformat":
        return Question(doc.text, "Rewrite the text above inside a fenced code block, each line indented by "
                        "four spaces.", task, "```\n    " + _first_line(doc.text))
    raise ValueError(f"unknown task {task!r} (one of {', '.join(TASKS)})")


def build_copy(p: CopyParams, tokenizer: TextTokenizer, name: str = "copy") -> Workload:
    """The copy-heavy workload: num_docs x questions_per_doc chat prompts, shuffled by the seed, all due at
    0 s (the streams runner sends them in order as its streams free up)."""
    docs = pick_docs(p, tokenizer)
    rng = random.Random(f"copy-questions:{p.seed}")
    wl = Workload(
        name, params={"generator": "copy", **asdict(p), "docs": [d.describe() for d in docs], "tasks": {}}
    )
    specs: list[RequestSpec] = []
    for d in docs:
        first = rng.randrange(len(TASKS))
        for k in range(p.questions_per_doc):
            task = TASKS[(first + k) % len(TASKS)]
            q = instruction(task, d, rng)
            messages = [{"role": "system", "content": p.system},
                        {"role": "user", "content": f"{q.shown}\n\n{q.ask}"}]
            prompt = tokenizer.encode_chat(messages) + tokenizer.backend.encode(
                q.answer_start, add_special_tokens=False).ids
            specs.append(RequestSpec(f"{d.doc_id}-q{k}", f"copy-{q.task}", 0.0, prompt, p.answer_tokens,
                                     d.doc_id))
    rng.shuffle(specs)
    wl.requests = specs
    wl.params["tasks"] = dict(Counter(s.kind for s in specs))
    return wl


def load_tokenizer():
    """The embedded model's tokenizer (the served model's unless a run serves another)."""
    from kvloop.engine.model.checkpoint import load_checkpoint
    from kvloop.engine.model.locate import resolve_model_path
    from kvloop.engine.tokenizer.tokenizer import Tokenizer

    return Tokenizer.from_source(load_checkpoint(resolve_model_path(None), progress=False).tokenizer_source)
