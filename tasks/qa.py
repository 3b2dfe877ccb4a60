"""Long-document QA: one byte-stable head (system + paragraph-numbered document + worked examples)
shared by every question.

Flow of `run_qa`: build the agent (tool: `search_document`) whose head embeds the document (each
paragraph after its id, "[P3] ...") and the worked examples (demonstrated search-then-answer turns,
tasks/prompts.py); check that it fits the context; prefill the head once (the leader request,
max_new_tokens=0); then fan the questions out as branches of that run, each extending the head.
Per question: the first action is a search (tool_choice="required"; the query may not be empty or
the tool's name), which returns the best sentences with their paragraph ids (tasks/passages.py);
the answer is then constrained to a verbatim span of those sentences or "not found", checked by the
`verify` callback against its paragraph (a rejection rolls the branch back once with a note), and
the last allowed call may only answer, so every question ends with an answer or an explicit "not
found". The accepted span is widened to the whole answering phrase of its sentence
(`passages.expand_answer`). One answers.jsonl line per question, written and flushed as it is answered, so an
interrupted run keeps what it answered.

CLI: `radixagent qa --doc FILE --questions FILE [--backend embedded|URL] [--no-cache]
[--concurrency N] [--out DIR]` (tasks/qa_cli.py: the flags and the summary table).
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent import Agent, Example, Run, Step, StepRecord, Tool, tool
from agent.constraints import span_pattern
from agent.examples import ExampleCall
from runtime.backends.base import Backend, Completion
from runtime.errors import RadixAgentError
from tasks import documents, prompts
from tasks.backend_setup import GREEDY, context_limit, count_tokens, with_cache
from tasks.citations import Verdict, check_answer
from tasks.documents import Document, search_terms
from tasks.outcomes import ItemOutcome, SuiteOptions, SuiteOutcome
from tasks.output import JsonlSink, progress_bar
from tasks.passages import NAME, Sentence, SentenceIndex, expand_answer, number_paragraphs, sentence_of
from tasks.questions import Question
from tasks.scoring import score_answer

#: tokens the context must leave beside the head: question, passages, answer, one rollback note
QA_ROOM = 640
QA_MAX_STEPS = 4
SEARCH = "search_document"
QA_MAX_NEW_TOKENS = 96
#: how an answer action starts: compact from llguidance, '{"answer": "' from SGLang's xgrammar
ANSWER_OPEN = re.compile(r'\{\s*"answer"\s*:\s*"')

OnStep = Callable[[Question, Step], None]


@dataclass(slots=True)
class QAResult:
    """One question: its answers.jsonl row and its model calls (StepRecords, in order)."""

    row: dict[str, Any]
    records: list[StepRecord]
    status: str


@dataclass(slots=True)
class QAReport:
    """A QA run: per-question results (in completion order) and the head's prefill record."""

    doc: str
    results: list[QAResult] = field(default_factory=list)
    prefill: StepRecord | None = None
    e2e_s: float = 0.0
    interrupted: bool = False

    def raise_if_interrupted(self) -> None:
        """For callers inside a larger run (the eval): Ctrl-C must stop that run too, not only
        this QA pass, which swallows it to keep its partial answers."""
        if self.interrupted:
            raise KeyboardInterrupt

    @property
    def records(self) -> list[StepRecord]:
        head = [self.prefill] if self.prefill is not None else []
        return head + [r for res in self.results for r in res.records]


def search_tool(doc: Document, question: str = "", evidence: list[Sentence] | None = None) -> Tool:
    """`search_document(query)`: the best matching sentences of the document, each after its
    paragraph id ("[P4] ..."), searched for together with `question` (tasks/passages.py defines
    odd queries). Sentences returned are appended to `evidence`. The tool's spec does not depend
    on either, so every question's prompt head stays identical."""
    index = SentenceIndex(doc)

    def search_document(query: str) -> str:
        """Search the document; returns the sentences that best match, each after its paragraph id.

        Args:
            query: the key words of the question, e.g. "night train Vienna leave"
        """
        found = index.search(query, question)
        if evidence is not None:
            evidence.extend(s for s in found if s not in evidence)
        return "\n".join(s.render() for s in found) or prompts.QA_NO_MATCH

    return tool(search_document, description=prompts.QA_SEARCH_DOC)


def qa_examples(count: int | None = None) -> list[Example]:
    """The first `count` (default all) worked examples of the QA head."""
    rows = prompts.QA_EXAMPLES if count is None else prompts.QA_EXAMPLES[:count]
    return [
        Example(q, answer, (ExampleCall(SEARCH, {"query": query}, obs),)) for q, query, obs, answer in rows
    ]


def build_agent(
    backend: Backend,
    doc: Document,
    *,
    max_steps: int = QA_MAX_STEPS,
    trace_path: Path | None = None,
    examples: int | None = None,
) -> Agent:
    """The QA agent: its head (system + tool + numbered document + worked examples) is the same
    for every question; the first action of every question is a search (tool_choice="required")."""
    title = prompts.DOCUMENT_TITLE.format(name=Path(doc.path).name)
    return Agent(
        backend,
        system=prompts.QA_AGENT_SYSTEM,
        tools=[search_tool(doc)],
        documents=[(title, number_paragraphs(doc.text))],
        max_steps=max_steps,
        reflect=False,
        dead_end=False,
        max_backtracks=1,
        trace_path=trace_path,
        tool_choice="required",
        sampling={**GREEDY, "max_new_tokens": QA_MAX_NEW_TOKENS},
        examples=qa_examples(examples),
    )


def task_text(question: str) -> str:
    return prompts.QA_TASK.format(question=question)


def prefill_head(leader: Run) -> StepRecord | None:
    """Compute the head's KV once (max_new_tokens=0; 1 where a server needs >= 1): the leader request."""
    head = leader.layout.render(mark=0, generation_prompt=False)
    completion: Completion | None = None
    for max_new in (0, 1):
        try:
            completion = leader.generate(
                head, {**GREEDY, "max_new_tokens": max_new}, rid=f"{leader.ctx.run_id}-prefill"
            )
            break
        except RadixAgentError:
            continue
    return None if completion is None else leader.record_prefill(head, completion)


def check_head_fits(backend: Backend, doc: Document, leader: Run) -> None:
    """TaskInputError naming the document when its head leaves no room for a question in the context."""
    head = leader.layout.render(mark=0, generation_prompt=False)
    tokens = len(head.ids) if head.ids is not None else count_tokens(backend, head.text)
    documents.check_fits(doc, tokens, context_limit(backend) - QA_ROOM)


def answer_question(
    leader: Run, branch: int, doc: Document, question: Question, on_step: OnStep | None = None
) -> QAResult:
    """Run one question as branch `branch` of the leader's run (it extends the prefilled head).

    A custom policy over `Run.step`: after each search, the answer is constrained to a verbatim
    span of the sentences found so far (or "not found"); the last step may only answer.
    """
    verdicts: list[Verdict] = []
    evidence: list[Sentence] = []

    def verify(answer: str) -> tuple[bool, str]:
        verdicts.append(judge(doc, question.question, answer, evidence))
        return verdicts[-1].ok, verdicts[-1].reason

    tools = {**leader.ctx.tools, SEARCH: search_tool(doc, question.question, evidence)}  # same spec
    ctx = dataclasses.replace(leader.ctx, verify=verify, tools=tools)
    layout = leader.layout.clone()
    layout.truncate(0)
    head = layout.render(generation_prompt=False)
    ctx.breaks.expect(branch, head.ids if head.ids is not None else head.text)  # extend the head, like a fork
    run = Run(ctx, layout, task_text(question.question), branch=branch)
    started = time.perf_counter()
    while not run.done:
        if len(run.steps) >= ctx.config.max_steps - 1:
            run.tool_choice = "none"  # the last call answers: never end without an answer
        step = run.step()
        if step.tool is not None and evidence:
            run.answer_schema = answer_schema(evidence, question.question)
        if on_step is not None:
            on_step(question, step)
        cut = salvage_answer(step)
        if cut is not None and not run.done and verify(cut)[0]:
            # A custom-policy move: the answer ran past max_new_tokens (so its JSON never closed) but
            # its complete sentences verify; accept them rather than ask again (greedy would repeat).
            run.answer, run.verified, run.status = cut, True, "answered"
    source = sentence_of(run.answer, evidence) if run.answer else None
    if source is not None:  # answer extraction: the model's span, widened to its whole phrase
        run.answer = expand_answer(run.answer or "", source, question.question)
    row = answer_row(question, run, verdicts, time.perf_counter() - started)
    return QAResult(row, list(run.trace), run.status)


#: evidence holding this fraction of the question's content words is about the question: "not found"
#: is then no longer an allowed answer (a small model otherwise takes that exit on easy questions)
COVERED = 0.5


def answer_schema(evidence: Sequence[Sentence], question: str) -> dict[str, Any]:
    """An answer is a verbatim span of the evidence sentences, or "not found" while the evidence
    does not cover the question."""
    asked = set(search_terms(question))
    seen = {t for s in evidence for t in search_terms(s.text)}
    covered = bool(asked) and len(asked & seen) >= COVERED * len(asked)
    extra = [] if covered else [prompts.QA_NOT_FOUND]
    return {"type": "string", "pattern": span_pattern([s.text for s in evidence], extra=extra)}


def judge(doc: Document, question: str, answer: str, evidence: Sequence[Sentence]) -> Verdict:
    """ "not found" stands; a span of the evidence is checked against its sentence's paragraph and
    the paragraphs of the rest of the evidence (a two-hop chain); anything else as written."""
    if answer.strip().lower() == prompts.QA_NOT_FOUND:
        return Verdict(True, "the document does not say", answer)
    source = sentence_of(answer, list(evidence))
    if source is None:
        return check_answer(doc, question, answer)
    onward = next_hop(question, source, evidence)
    if onward is not None:
        return Verdict(
            False, f"that names the link; what the question asks is in [P{onward.paragraph}]", answer
        )
    chain = [source, *(s for s in evidence if s is not source)]
    refs = ", ".join(f"L{s.first_line}-L{s.last_line}" for s in chain)
    verdict = check_answer(doc, question, f"{answer} ({refs})")
    if verdict.ok:
        return dataclasses.replace(verdict, paragraphs=(source.paragraph,), cited_by="evidence")
    return verdict


def next_hop(question: str, source: Sentence, evidence: Sequence[Sentence]) -> Sentence | None:
    """The evidence sentence a two-hop answer should come from, when `source` is only the link.

    `source` ("Sofia's sister is Omar.") is a link when it holds the question's names ("Sofia"),
    misses question words ("live") that another evidence sentence covers, and that sentence names
    someone `source` introduced ("Omar lives in Lisbon.") but none of the question's names. A
    question the link itself answers ("Who is Sofia's sister?") misses nothing: its answer stands.
    """
    asked_names = set(NAME.findall(question))
    if not asked_names & set(NAME.findall(source.text)):
        return None
    missing = set(search_terms(question)) - set(search_terms(source.text))
    introduced = {n for n in NAME.findall(source.text) if n not in asked_names and search_terms(n)}
    for other in evidence:
        names = set(NAME.findall(other.text))
        if (
            other is not source
            and missing & set(search_terms(other.text))
            and introduced & names
            and not asked_names & names
        ):
            return other
    return None


def salvage_answer(step: Step) -> str | None:
    """The complete sentences of an answer cut off by max_new_tokens (its JSON never closed), or None."""
    record = step.record
    if step.action is not None or record is None or record.finish_reason != "length":
        return None
    opened = ANSWER_OPEN.match(step.output)  # SGLang's xgrammar writes '{"answer": "' (a space)
    if opened is None:
        return None
    text = step.output[opened.end() :]
    end = text.rfind(". ")
    if end <= 0:
        return None
    try:
        return json.loads('"' + text[: end + 1] + '"')
    except json.JSONDecodeError:
        return None


def answer_row(question: Question, run: Run, verdicts: list[Verdict], latency_s: float) -> dict[str, Any]:
    """The answers.jsonl line of one question."""
    final = verdicts[-1] if verdicts and run.status == "answered" else None
    answer = run.answer
    row: dict[str, Any] = {
        "id": question.id,
        "question": question.question,
        "answer": answer,
        "citations": list(final.citations) if final else [],
        "cited_by": final.cited_by if final else None,
        "paragraphs": list(final.paragraphs) if final else [],
        "status": run.status,
        "verified": run.verified,
        "steps": len(run.trace),
    }
    if answer is None:
        row["answer"] = answer = prompts.QA_NOT_FOUND  # explicit, never a silent gap
    if question.answer is not None:
        score = score_answer(answer or "", question.answer)
        row.update(
            gold=question.answer,
            correct=bool(score.contains),
            exact=score.exact,
            contains=score.contains,
            f1=round(score.f1, 4),
        )
    first = run.trace[0] if run.trace else None
    row.update(
        prompt_tokens=sum(r.prompt_tokens for r in run.trace),
        cached_tokens=sum(r.cached_tokens for r in run.trace),
        ttft_s=round(first.ttft_s, 4) if first else None,
        latency_s=round(latency_s, 4),
    )
    return row


def run_qa(
    backend: Backend,
    doc: Document,
    questions: Sequence[Question],
    *,
    concurrency: int = 1,
    out_dir: str | Path | None = None,
    progress: bool = False,
    max_steps: int = QA_MAX_STEPS,
    on_step: OnStep | None = None,
    on_prefill: Callable[[StepRecord], None] | None = None,
    examples: int | None = None,
) -> QAReport:
    """Answer `questions` about `doc` on `backend`; see the module docstring.

    `examples`: how many of the worked examples go into the head (default all).
    Raises TaskInputError when the document does not fit the context. Ctrl-C stops the run: the
    report (and answers.jsonl) keeps the questions answered so far and says `interrupted`.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    out = Path(out_dir) if out_dir is not None else None
    trace_path = _fresh(out / "trace.jsonl") if out is not None else None
    agent = build_agent(backend, doc, max_steps=max_steps, trace_path=trace_path, examples=examples)
    leader = agent.start("", session_id=f"qa-{uuid.uuid4().hex[:12]}")
    report, started = QAReport(doc=doc.path), time.perf_counter()
    sink = JsonlSink(out / "answers.jsonl") if out is not None else None
    try:
        check_head_fits(backend, doc, leader)
        report.prefill = prefill_head(leader)
        if on_prefill is not None and report.prefill is not None:
            on_prefill(report.prefill)
        _fan_out(leader, doc, questions, concurrency, report, sink, progress, on_step)
    finally:
        report.e2e_s = time.perf_counter() - started
        if sink is not None:
            sink.close()
        leader.close()
        agent.close()
    return report


def _fresh(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("", encoding="utf-8")
    return path


def _fan_out(
    leader: Run,
    doc: Document,
    questions: Sequence[Question],
    concurrency: int,
    report: QAReport,
    sink: JsonlSink | None,
    progress: bool,
    on_step: OnStep | None,
) -> None:
    def one(index: int, question: Question) -> None:
        result = answer_question(leader, index + 1, doc, question, on_step)
        report.results.append(result)
        if sink is not None:
            sink.write(result.row)
        advance()

    with progress_bar(progress, f"QA {Path(doc.path).name}", len(questions)) as advance:
        try:
            if concurrency == 1:
                for index, question in enumerate(questions):
                    one(index, question)
                return
            with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="qa") as pool:
                futures = [pool.submit(one, i, q) for i, q in enumerate(questions)]
                try:
                    for future in as_completed(futures):
                        future.result()
                except KeyboardInterrupt:
                    for future in futures:
                        future.cancel()
                    raise
        except KeyboardInterrupt:
            report.interrupted = True


# ---- the "longdoc" suite and the CLI ----------------------------------------------------------

LONGDOC_SETS: tuple[tuple[str, str], ...] = (("needle/doc_2048_0.txt", "needle/questions_2048_0.jsonl"),)


def run_longdoc_suite(backend: Backend, options: SuiteOptions) -> SuiteOutcome:
    """The eval's "longdoc" suite: the QA runner over a small bundled needle subset."""
    from tasks import data_path
    from tasks.questions import load_questions

    backend = with_cache(backend, options.prefix_cache)
    items: list[ItemOutcome] = []
    started = time.perf_counter()
    remaining = options.limit
    for doc_name, questions_name in LONGDOC_SETS:
        if remaining is not None and remaining <= 0:
            break
        doc = documents.load_document(data_path(doc_name))
        questions = load_questions(data_path(questions_name))[:remaining]
        report = run_qa(backend, doc, questions, concurrency=options.concurrency, progress=options.progress)
        report.raise_if_interrupted()
        items += _items(report, ItemOutcome)
        remaining = None if remaining is None else remaining - len(questions)
    return SuiteOutcome("longdoc", items, time.perf_counter() - started)


def _items(report: QAReport, item_type: Any) -> list[Any]:
    items = []
    for index, result in enumerate(
        sorted(report.results, key=lambda r: r.records[0].branch if r.records else 0)
    ):
        steps = ([report.prefill] if index == 0 and report.prefill is not None else []) + result.records
        row = result.row
        items.append(item_type(row["id"], row["answer"], row.get("correct"), result.status, steps))
    return items
