"""The copy-heavy workload (issue 56's speculation benchmark): deterministic by seed, its documents exact
chunks of real files this Python installation ships, its questions chat prompts that fit the context."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from kvloop.engine.bench.copy_workload import (
    SOURCES,
    TASKS,
    CopyParams,
    build_copy,
    candidate_files,
    source_roots,
)
from kvloop.engine.core import defaults as D

SMALL = CopyParams(num_docs=3, doc_tokens=120, questions_per_doc=5, answer_tokens=16, seed=7)


@pytest.fixture(scope="module")
def small(tokenizer):
    return build_copy(SMALL, tokenizer)


def test_candidates_are_sorted_real_files():
    files = candidate_files()
    assert files == sorted(files) and len(files) >= 20
    roots = source_roots()
    assert {src for src, _ in files} <= set(SOURCES)
    assert all((roots[src] / rel).is_file() for src, rel in files[:50])


def test_same_seed_same_workload(tokenizer, small):
    again = build_copy(SMALL, tokenizer)
    assert [(r.request_id, r.kind, r.prompt, r.max_tokens) for r in again.requests] == [
        (r.request_id, r.kind, r.prompt, r.max_tokens) for r in small.requests]
    assert again.params["docs"] == small.params["docs"]
    other = build_copy(CopyParams(**{**SMALL.__dict__, "seed": 8}), tokenizer)
    assert [d["sha256"] for d in other.params["docs"]] != [d["sha256"] for d in small.params["docs"]]


def test_documents_are_chunks_of_the_files_they_name(tokenizer, small):
    docs = small.params["docs"]
    assert len(docs) == SMALL.num_docs
    assert len({d["source"] for d in docs}) > 1  # the sources take turns: code and prose both
    for d in docs:
        text = (Path(d["root"]) / d["path"]).read_text(encoding="utf-8")
        chunk = text[d["start_char"]:d["start_char"] + d["chars"]]
        assert hashlib.sha256(chunk.encode()).hexdigest() == d["sha256"]
        assert d["start_char"] == 0 or text[d["start_char"] - 1] == "\n"  # whole lines
        n = len(tokenizer.encode(chunk))
        assert SMALL.doc_tokens // 2 <= n <= SMALL.doc_tokens + 2, (d["path"], n)


def test_questions_copy_their_document(tokenizer, small):
    assert len(small.requests) == SMALL.num_docs * SMALL.questions_per_doc
    assert {r.kind for r in small.requests} <= {f"copy-{t}" for t in TASKS}
    assert len({r.kind for r in small.requests}) >= 3
    by_doc = {d["doc_id"]: d for d in small.params["docs"]}
    for r in small.requests:
        d = by_doc[r.group]
        text = (Path(d["root"]) / d["path"]).read_text(encoding="utf-8")
        shown = tokenizer.decode(r.prompt)
        first_line = text[d["start_char"]:].splitlines()[0]
        assert first_line in shown  # the document is in the prompt (typo: one word differs, not the rest)
        if r.kind in ("copy-quote", "copy-continue", "copy-typo"):  # the answer's first line, from the file
            assert shown.rstrip().splitlines()[-1].strip() in text
        assert r.max_tokens == SMALL.answer_tokens
        assert len(r.prompt) + r.max_tokens <= D.MAX_MODEL_LEN.value
    # questions over one document share its prefix (the document comes first in the message; a typo
    # question shows it with one word changed)
    groups: dict[str, list[list[int]]] = {}
    for r in small.requests:
        if r.kind != "copy-typo":
            groups.setdefault(r.group, []).append(r.prompt)
    for prompts in groups.values():
        a, b = prompts[0], prompts[1]
        common = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        assert common >= SMALL.doc_tokens // 2
