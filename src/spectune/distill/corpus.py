"""The target's own answers to what users ask: prompts written by the model, answers generated.

A draft learns what it is shown. The corpus here covers the tasks of the evaluation set
(multi-turn chat, translation, summarization, question answering, math reasoning, answering
from a passage) plus open chat and code, and every answer in it is the target's own
(self-distillation). No hub data is reachable, so the instruct model writes the prompts too:

- **User turns.** The chat template up to the start of a user turn, plus a short task
  opener ("Write a Python function that", "Why does", ...), sampled at T = 1 until the
  model closes the turn. A follow-up turn of a multi-turn chat is written the same way
  after the first exchange.
- **Documents.** Texts to summarise, passages to answer from and sentences to translate
  are the target's own answers to writing requests that it wrote itself ("Write a short
  article about" + its completion). Those answers are target outputs, so they are kept as
  training answers too (category ``writing``).
- **Seeds.** GSM8K questions (math) and Alpaca seed instructions from ``shared/data``.

Prompt mixes (``CorpusSettings.prompt_mix``, in every shard's metadata). Mix 1 built
shards 0-56 and 58 of the committed corpus (57 was never finished); its questions were the
model's own user turns ("Which superhero has the most synonyms?") and its translations went
from English into eight languages, Chinese and Japanese included, so the test split's
everyday questions and its translations into English had nothing like them (first-token
acceptance there 0.37 and 0.35 against 0.58-0.65 for code and math). Mix 2, the default:

- **Closed-book questions.** Half the question-answering items ask a question the model
  wrote from a document it wrote (as for passage answering), without the document.
- **Into English.** Half the translation items are translated back: the target's own
  translation becomes the text of a "translate into English" prompt (a second record).
- **Sentences.** A text to translate is a sentence or two the model wrote as such (mix 1
  also took page-long articles, whose translations mostly ran into the token limit).
- **Languages.** Only those the target writes (French and Spanish twice as often as
  German, Italian and Portuguese); mix 1's Chinese and Japanese answers were mostly one
  repeated character.

Answers are decoded with spectune's batched runtime (``BatchEngine``, plain decoding,
continuous batching), each greedy or at T = 0.7 (half and half). Work is cut into shards
of ``items_per_shard`` items; everything in shard ``s`` follows from ``(seed, s)``, a shard
file is written whole or not at all, so a killed run resumes at the first missing shard
and several processes can share the work (``--shards start:stop:step``).

Storage: token ids only (a few bytes per position, small enough to commit). A shard is a
safetensors file with ``tokens`` [sum of lengths] int32 (prompt then answer, per record),
``offsets`` [records + 1] int64 and ``prompt_lengths`` [records] int32; the metadata holds
one JSON object per record (id, category, temperature, finish reason). Hidden states and
soft labels are recomputed from these ids by one teacher-forced pass when training.

Held out: a record whose id hashes to 0 mod 50 is ``split == "heldout"`` (2%), never used
for training; answers are deduplicated by prompt when read.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from spectune.decode.batch import BatchEngine
from spectune.distill.settings import PROMPT_MIXES, CorpusSettings
from spectune.distill.sources import read_json_lines
from spectune.errors import InvalidParameterError
from spectune.models.base import LanguageModel
from spectune.models.tokenizer import Tokenizer
from spectune.sampling import SamplingParams

__all__ = [
    "CATEGORY_SHARES",
    "PROMPT_MIXES",
    "Answer",
    "CorpusSettings",
    "SeedData",
    "build_shards",
    "corpus_stats",
    "read_answer_shard",
    "read_answers",
]

# Share of a shard's items per task. "writing" is not drawn: documents come with the
# summarization, passage and translation items that need them.
CATEGORY_SHARES: dict[str, float] = {
    "chat": 0.10,
    "multi_turn_chat": 0.15,
    "translation": 0.14,
    "summarization": 0.14,
    "question_answering": 0.14,
    "math_reasoning": 0.12,
    "retrieval_qa": 0.13,
    "code": 0.08,
}

ANSWER_TEMPERATURES = (0.0, 0.7)
CLOSED_BOOK_SHARE = 0.5  # mix 2: question-answering items asked from a written document
INTO_ENGLISH_SHARE = 0.5  # mix 2: translation items translated back into English
_NEEDS_DOCUMENT = frozenset({"summarization", "retrieval_qa", "translation"})
HELDOUT_MODULUS = 50  # 1 in 50 records is held out for evaluation

_OPENERS: dict[str, tuple[str, ...]] = {
    "chat": (
        "I",
        "Can you help me",
        "I'm trying to",
        "What do you think about",
        "Give me some tips",
        "I need advice on",
        "Could you suggest",
        "Write a short poem about",
        "Tell me a story",
        "Recommend",
        "Hi! I",
        "Help me plan",
        "Write a haiku about",
        "Can you give me ideas for",
        "What's a good way to",
        "Write a thank-you note",
    ),
    "question_answering": (
        "What is",
        "Why do",
        "Why does",
        "How does",
        "How do",
        "What are the main differences between",
        "Who was",
        "When did",
        "Can you explain",
        "What causes",
        "Is it true that",
        "Which",
        "How many",
        "What happens when",
        "Why is",
        "Where does",
        "What is the purpose of",
    ),
    "code": (
        "Write a Python function that",
        "Write a Python class that",
        "Write a SQL query that",
        "How do I use Python to",
        "Write a JavaScript function that",
        "Write a bash command that",
        "Explain the difference between",
        "In Python, how can I",
        "Write a function in C that",
        "Show me how to",
        "Write a Python program that",
        "What does the Python",
    ),
    "document": (
        "Write a short article about",
        "Write a paragraph about",
        "Write a short news report about",
        "Describe",
        "Write a short story about",
        "Write a product description for",
        "Write a short essay about",
        "Explain in a few paragraphs",
        "Write a blog post about",
        "Write a short history of",
        "Write a short report on",
        "Write an email to",
    ),
    "sentence": (
        "Write one sentence about",
        "Write two sentences about",
        "Write a short sentence describing",
        "Write a sentence that a tourist might say",
        "Write a short message to",
    ),
    "follow_up": (
        "",
        "Can you",
        "What about",
        "Thanks! ",
        "Why",
        "How",
        "Could you explain",
        "And",
        "Can you give me an example",
        "What if",
        "Please",
    ),
}

_LANGUAGES = (
    "French",
    "Spanish",
    "German",
    "Italian",
    "Portuguese",
    "Dutch",
    "Chinese",
    "Japanese",
)
# Prompt mix 2: the languages the 135M target writes at all (its Chinese and Japanese
# answers in mix 1 were mostly one repeated character), weighted towards French and Spanish.
_WRITTEN_LANGUAGES = ("French", "French", "Spanish", "Spanish", "German", "Italian", "Portuguese")
_TRANSLATE = (
    'Translate into {lang}: "{text}"',
    "Translate the following text into {lang}:\n\n{text}",
    'How do you say "{text}" in {lang}?',
    "Translate this to {lang}: {text}",
    "Please translate the sentence below into {lang}.\n\n{text}",
)
_SUMMARIZE = (
    "Summarize the following text in {n} sentences.\n\n{text}",
    "Give a one-sentence summary of this text:\n\n{text}",
    "Summarize:\n\n{text}",
    "What are the main points of the following text?\n\n{text}",
    "Write a short summary of the text below.\n\n{text}",
    "{text}\n\nSummarize the text above in {n} sentences.",
)
_PASSAGE = (
    "Answer the question using only the passage below.\n\nPassage:\n{text}\n\nQuestion: {q}",
    "Context:\n{text}\n\nBased on the context above, answer: {q}",
    "Read the text and answer the question.\n\n{text}\n\nQuestion: {q}",
    "{text}\n\nUsing the information above, {q}",
)
_MATH_SUFFIX = (
    "",
    "",
    " Show your reasoning step by step.",
    " Explain your answer.",
    " Think step by step.",
)
_INTO_ENGLISH = (
    'Translate into English: "{text}"',
    'Translate this into English: "{text}"',
    "Translate the following text into English:\n\n{text}",
)
# Mix 2's closed-book questions come from texts that inform (not emails or stories).
_INFORMING = (
    "Write a short article about",
    "Write a paragraph about",
    "Explain in a few paragraphs",
    "Write a short essay about",
    "Write a short history of",
    "Write a short report on",
)
_ASK_GENERAL = (
    "Write one general question about the topic of the text below, a question someone could "
    "ask without having read it. Reply with the question only.\n\n{text}"
)
_ASK_QUESTION = (
    "Write one question that can be answered using only the text below. Reply with the "
    "question only.\n\n{text}"
)


@dataclass(frozen=True)
class SeedData:
    """Human-written seeds: GSM8K questions and Alpaca instructions."""

    math_questions: tuple[str, ...] = ()
    instructions: tuple[str, ...] = ()

    @classmethod
    def read(cls, paths: Sequence[Path]) -> SeedData:
        math: list[str] = []
        instructions: list[str] = []
        for path in paths:
            if not path.is_file():
                raise InvalidParameterError(f"seed file not found: {path}")
            for _, record in read_json_lines(path):  # one line when not JSON lines
                if not isinstance(record, dict):
                    continue
                if isinstance(record.get("question"), str):
                    math.append(record["question"].strip())
                elif isinstance(record.get("instruction"), str):
                    extra = ""
                    instances = record.get("instances")
                    if isinstance(instances, list) and instances and isinstance(instances[0], dict):
                        extra = str(instances[0].get("input") or "").strip()
                    text = record["instruction"].strip()
                    instructions.append(f"{text}\n\n{extra}" if extra else text)
        return cls(tuple(math), tuple(instructions))


@dataclass(frozen=True)
class Answer:
    """One target answer: the chat-templated prompt and the reply the target gave."""

    id: str
    category: str
    split: str  # "train" | "heldout"
    temperature: float
    prompt: tuple[int, ...]  # chat-templated prompt token ids, generation prompt included
    answer: tuple[int, ...]  # the target's reply token ids (EOS included when it ended)
    finish: str = "eos"  # "eos" | "length"


def split_of(record_id: str) -> str:
    digest = int(hashlib.sha1(record_id.encode()).hexdigest(), 16)
    return "heldout" if digest % HELDOUT_MODULUS == 0 else "train"


# --- decoding -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Request:
    prompt: list[int]
    temperature: float
    max_tokens: int
    seed: int


@dataclass(frozen=True)
class _StopAt:
    """Stops a written user turn at the template's markers (EOS ends answers already)."""

    ids: frozenset[int]

    def check(self, output: Sequence[int]) -> int | None:
        return len(output) if output and output[-1] in self.ids else None


def _decode_all(
    model: LanguageModel,
    requests: Sequence[_Request],
    settings: CorpusSettings,
    stop_ids: frozenset[int],
) -> list[tuple[list[int], str]]:
    """Plain decoding of every request on the batched runtime: (tokens, finish reason).

    Continuous batching: a finished row takes the next waiting request at once.
    """
    longest = max((len(r.prompt) + r.max_tokens for r in requests), default=2)
    engine = BatchEngine(model, None, max_batch=settings.max_batch, capacity=longest + 1)
    stop = _StopAt(stop_ids)
    results: list[tuple[list[int], str]] = [([], "length") for _ in requests]
    waiting = list(range(len(requests)))
    waiting.reverse()  # pop() takes them in order
    while waiting or engine.active:
        while waiting and engine.has_room:
            index = waiting.pop()
            req = requests[index]
            params = SamplingParams(
                temperature=req.temperature,
                top_p=0.95 if req.temperature > 0 else 1.0,
                max_tokens=req.max_tokens,
                seed=req.seed,
            )
            engine.add(str(index), req.prompt, params, stop=stop)
        for update in engine.step():
            tokens, _ = results[int(update.request_id)]
            tokens.extend(update.record.emitted)
            if update.record.finish_reason is not None:
                results[int(update.request_id)] = (tokens, update.record.finish_reason)
    return results


# --- prompt writing -------------------------------------------------------------------------


@dataclass
class _Item:
    """One corpus item on its way through the rounds of a shard."""

    id: str
    category: str
    temperature: float
    messages: list[dict[str, str]] = field(default_factory=list)
    document: str = ""
    question: str = ""
    template: str = ""
    opener: str = ""
    closed_book: bool = False  # a question written from a document, asked without it
    into_english: bool = False  # the translation is then translated back into English


class _Writer:
    """Chat-template plumbing: where a user turn starts, and the chat prompt of messages."""

    _SENTINEL = "\u2063SPECTUNE\u2063"

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.hf = tokenizer.hf

    def _ids(self, text: str) -> list[int]:
        return [int(t) for t in self.hf.encode(text, add_special_tokens=False)]

    def user_turn_prompt(self, history: list[dict[str, str]], opener: str) -> list[int]:
        """Token ids of the chat up to the start of a new user turn, plus ``opener``."""
        turn = [*history, {"role": "user", "content": self._SENTINEL}]
        text = self.hf.apply_chat_template(turn, tokenize=False, add_generation_prompt=False)
        head = text[: text.index(self._SENTINEL)]
        return self._ids(head + opener)

    def chat_prompt(self, messages: list[dict[str, str]]) -> list[int]:
        text = self.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return self._ids(text)

    def text(self, tokens: list[int], *, whole_sentences: bool = False) -> str:
        """Decoded text; ``whole_sentences`` drops an unfinished last sentence (a document
        cut by the token limit)."""
        text = str(self.hf.decode(tokens, skip_special_tokens=True))
        if whole_sentences:
            end = max(text.rfind(mark) for mark in (". ", ".\n", "! ", "? ", "?\n", "!\n"))
            if end > len(text) // 2:
                text = text[: end + 1]
        return text


def _clean_turn(opener: str, written: str) -> str:
    """The written user turn: the opener and what the model added (which starts with its
    own space when it continues a word boundary)."""
    return re.sub(r"[ \t]+\n", "\n", (opener + written).strip())


def _leading_sentences(text: str, count: int) -> str:
    """The first ``count`` sentences of ``text`` (all of it if it has fewer)."""
    ends = [m.end() for m in re.finditer(r"[.!?](?=\s|$)", text)]
    return text[: ends[count - 1]].strip() if len(ends) >= count else text.strip()


def _first_question(text: str, *, asked: bool = False) -> str:
    """The first line of the written question; ``asked``: the first that ends in "?" (a
    closed-book question must stand alone)."""
    for line in text.splitlines():
        line = line.strip().strip('"').strip()
        line = re.sub(r"^(Question:|Q:)\s*", "", line)
        if len(line) > 8 and (line.endswith("?") or not asked):
            return line
    return ""


class _Shard:
    """Everything one shard does: choose items, write prompts, answer them (in rounds)."""

    def __init__(
        self,
        index: int,
        model: LanguageModel,
        writer: _Writer,
        seeds: SeedData,
        settings: CorpusSettings,
    ) -> None:
        self.index = index
        self.model = model
        self.writer = writer
        self.seeds = seeds
        self.settings = settings
        self.rng = random.Random(f"{settings.seed}-{index}")
        eos = set(model.info.eos_token_ids)
        im_start = writer.hf.get_vocab().get("<|im_start|>")  # a turn opening ends one too
        if im_start is not None:
            eos.add(int(im_start))
        self.turn_stops = frozenset(eos)
        self.answers: list[Answer] = []
        self._serial = 0

    # Each round sends many requests through one batched decoder.
    def _run(self, requests: list[_Request]) -> list[tuple[list[int], str]]:
        return _decode_all(self.model, requests, self.settings, self.turn_stops)

    def _seed(self) -> int:
        self._serial += 1
        return self.settings.seed * 1_000_003 + self.index * 10_007 + self._serial

    def _record(
        self,
        item_id: str,
        category: str,
        temperature: float,
        prompt: list[int],
        answer: list[int],
        finish: str,
    ) -> None:
        if not answer:
            return
        record_id = f"{item_id}/{category}"
        self.answers.append(
            Answer(
                record_id,
                category,
                split_of(record_id),
                temperature,
                tuple(prompt),
                tuple(answer),
                finish,
            )
        )

    def _write_turns(self, items: list[_Item], histories: list[list[dict[str, str]]]) -> list[str]:
        requests = [
            _Request(
                self.writer.user_turn_prompt(h, it.opener),
                1.0,
                self.settings.max_turn_tokens,
                self._seed(),
            )
            for it, h in zip(items, histories, strict=True)
        ]
        outs = self._run(requests)
        return [
            _clean_turn(it.opener, self.writer.text(t))
            for it, (t, _) in zip(items, outs, strict=True)
        ]

    def _answer(
        self,
        items: list[_Item],
        prompts: list[list[int]],
        categories: list[str],
        temperatures: list[float],
        max_tokens: list[int],
        *,
        complete_only: bool = False,
    ) -> list[str]:
        """Decode the target's answers to ``prompts`` and keep each as a training record;
        returns their texts ("" for an answer cut by the token limit if ``complete_only``)."""
        requests = [
            _Request(p, t, n, self._seed())
            for p, t, n in zip(prompts, temperatures, max_tokens, strict=True)
        ]
        outs = self._run(requests)
        texts = []
        for it, p, c, t, (tokens, finish) in zip(
            items, prompts, categories, temperatures, outs, strict=True
        ):
            self._record(it.id, c, t, p, tokens, finish)
            if complete_only and finish == "length":
                texts.append("")
                continue
            texts.append(self.writer.text(tokens, whole_sentences=finish == "length").strip())
        return texts

    def build(self) -> list[Answer]:
        rng = self.rng
        names = list(CATEGORY_SHARES)
        weights = list(CATEGORY_SHARES.values())
        items = []
        for i in range(self.settings.items_per_shard):
            category = rng.choices(names, weights)[0]
            items.append(
                _Item(f"s{self.index:05d}-{i:03d}", category, rng.choice(ANSWER_TEMPERATURES))
            )

        # Round 1: the model writes first user turns and writing requests.
        needs_turn = []
        mix = self.settings.prompt_mix
        for it in items:
            if mix >= 2 and it.category == "question_answering":
                it.closed_book = rng.random() < CLOSED_BOOK_SHARE
            if mix >= 2 and it.category == "translation":
                it.into_english = rng.random() < INTO_ENGLISH_SHARE
            if it.closed_book:
                it.opener = rng.choice(_INFORMING)
            elif it.category in ("summarization", "retrieval_qa"):
                it.opener = rng.choice(_OPENERS["document"])
            elif it.category == "translation":
                if self.seeds.math_questions and rng.random() < 0.3:
                    it.document = rng.choice(self.seeds.math_questions)
                    continue
                # Mix 2 draws from the sentence openers listed twice: that is the draw that
                # built shards 59-70, so keep it (a shorter list would change those shards).
                sources = _OPENERS["sentence"] if mix >= 2 else _OPENERS["document"][:2]
                it.opener = rng.choice(_OPENERS["sentence"] + sources)
            elif it.category == "math_reasoning":
                if self.seeds.math_questions:
                    question = rng.choice(self.seeds.math_questions)
                    it.messages = [{"role": "user", "content": question + rng.choice(_MATH_SUFFIX)}]
                    continue
                it.opener = "Solve this math word problem:"
            elif it.category == "chat" and self.seeds.instructions and rng.random() < 0.15:
                it.messages = [{"role": "user", "content": rng.choice(self.seeds.instructions)}]
                continue
            elif it.category == "multi_turn_chat":
                it.opener = rng.choice(_OPENERS[rng.choice(("chat", "question_answering"))])
            else:  # chat, question answering, code
                it.opener = rng.choice(_OPENERS[it.category])
            needs_turn.append(it)
        for it, turn in zip(
            needs_turn, self._write_turns(needs_turn, [[] for _ in needs_turn]), strict=True
        ):
            if turn:
                it.messages = [{"role": "user", "content": turn}]

        # Round 2: answers to everything that is a complete chat now, and the documents.
        # A document request is answered at T = 0.7 (varied texts) and kept as "writing".
        first = [it for it in items if it.messages]
        documents = [it.category in _NEEDS_DOCUMENT or it.closed_book for it in first]
        texts = self._answer(
            first,
            [self.writer.chat_prompt(it.messages) for it in first],
            ["writing" if d else it.category for it, d in zip(first, documents, strict=True)],
            [0.7 if d else it.temperature for it, d in zip(first, documents, strict=True)],
            [
                self.settings.max_document_tokens if d else self.settings.max_answer_tokens
                for d in documents
            ],
        )
        for it, text, is_document in zip(first, texts, documents, strict=True):
            if is_document:
                it.document = text
            elif it.category == "multi_turn_chat":
                it.messages.append({"role": "assistant", "content": text})

        # Round 3: follow-up turns and passage questions.
        multi = [it for it in items if it.category == "multi_turn_chat" and len(it.messages) == 2]
        for it in multi:
            it.opener = rng.choice(_OPENERS["follow_up"])
        for it, turn in zip(
            multi, self._write_turns(multi, [it.messages for it in multi]), strict=True
        ):
            if turn:
                it.messages.append({"role": "user", "content": turn})
        passages = [
            it for it in items if (it.category == "retrieval_qa" or it.closed_book) and it.document
        ]
        asks = [
            self.writer.chat_prompt(
                [
                    {
                        "role": "user",
                        "content": (_ASK_GENERAL if it.closed_book else _ASK_QUESTION).format(
                            text=it.document
                        ),
                    }
                ]
            )
            for it in passages
        ]
        questions = self._answer(
            passages,
            asks,
            ["writing"] * len(passages),
            [0.7] * len(passages),
            [self.settings.max_turn_tokens] * len(passages),
        )
        for it, text in zip(passages, questions, strict=True):
            it.question = _first_question(text, asked=it.closed_book)

        # Round 4: the final prompts of the tasks that needed a document or a follow-up.
        final: list[_Item] = []
        for it in items:
            if it.category == "summarization" and it.document:
                template = rng.choice(_SUMMARIZE)
                content = template.format(text=it.document, n=rng.choice(("two", "three", "2")))
            elif it.category == "retrieval_qa" and it.document and it.question:
                content = rng.choice(_PASSAGE).format(text=it.document, q=it.question)
            elif it.closed_book and it.question:
                content = it.question
            elif it.category == "translation" and it.document:
                text = (
                    it.document
                    if len(it.document) < 600
                    else it.document[:600].rsplit(".", 1)[0] + "."
                )
                if mix >= 2:  # a sentence or two, as users translate; not a page
                    text = _leading_sentences(text, 2)
                languages = _LANGUAGES if mix == 1 else _WRITTEN_LANGUAGES
                content = rng.choice(_TRANSLATE).format(lang=rng.choice(languages), text=text)
            elif it.category == "multi_turn_chat" and len(it.messages) == 3:
                final.append(it)
                continue
            else:
                continue
            it.messages = [{"role": "user", "content": content}]
            final.append(it)
        texts = self._answer(
            final,
            [self.writer.chat_prompt(it.messages) for it in final],
            [it.category for it in final],
            [it.temperature for it in final],
            [self.settings.max_answer_tokens] * len(final),
            complete_only=True,
        )

        # Round 5 (mix 2): the target's own translations, translated back into English
        # (those it finished: one cut by the token limit is mostly a repeated phrase).
        back = [
            _Item(
                f"{it.id}-en",
                "translation",
                it.temperature,
                [
                    {
                        "role": "user",
                        "content": rng.choice(_INTO_ENGLISH).format(text=text),
                    }
                ],
            )
            for it, text in zip(final, texts, strict=True)
            if it.into_english and text
        ]
        self._answer(
            back,
            [self.writer.chat_prompt(it.messages) for it in back],
            ["translation"] * len(back),
            [it.temperature for it in back],
            [self.settings.max_answer_tokens] * len(back),
        )
        return self.answers


# --- storage --------------------------------------------------------------------------------


def _shard_path(folder: Path, index: int) -> Path:
    return folder / f"shard-{index:05d}.safetensors"


def _save(path: Path, answers: list[Answer], settings: CorpusSettings) -> None:
    from safetensors.torch import save_file

    sequences = [list(a.prompt) + list(a.answer) for a in answers]
    lengths = torch.tensor([len(s) for s in sequences], dtype=torch.long)
    tensors = {
        "tokens": torch.tensor([t for s in sequences for t in s], dtype=torch.int32),
        "offsets": torch.cat((torch.zeros(1, dtype=torch.long), lengths.cumsum(0))),
        "prompt_lengths": torch.tensor([len(a.prompt) for a in answers], dtype=torch.int32),
    }
    records = [
        {"id": a.id, "category": a.category, "temperature": a.temperature, "finish": a.finish}
        for a in answers
    ]
    metadata = {"records": json.dumps(records), "settings": json.dumps(settings.__dict__)}
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp), metadata=metadata)
    tmp.rename(path)  # a shard exists completely or not at all


def read_answer_shard(path: Path) -> list[Answer]:
    """The answers of one shard, in the order they were written."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        meta = handle.metadata()
        tokens = handle.get_tensor("tokens").tolist()
        offsets = handle.get_tensor("offsets").tolist()
        prompt_lengths = handle.get_tensor("prompt_lengths").tolist()
    answers = []
    for i, record in enumerate(json.loads(meta["records"])):
        seq = tokens[offsets[i] : offsets[i + 1]]
        answers.append(
            Answer(
                record["id"],
                record["category"],
                split_of(record["id"]),
                float(record["temperature"]),
                tuple(seq[: prompt_lengths[i]]),
                tuple(seq[prompt_lengths[i] :]),
                record["finish"],
            )
        )
    return answers


def read_answers(folder: Path, *, split: str | None = None) -> Iterator[Answer]:
    """Every answer in the corpus folder, shard by shard, deduplicated by prompt.

    ``split`` keeps only ``"train"`` or ``"heldout"`` records.
    """
    if not folder.is_dir():
        raise InvalidParameterError(f"corpus folder not found: {folder}")
    seen: set[tuple[int, ...]] = set()
    for path in sorted(folder.glob("shard-*.safetensors")):
        for item in read_answer_shard(path):
            if item.prompt in seen:
                continue
            seen.add(item.prompt)
            if split is None or item.split == split:
                yield item


def corpus_stats(folder: Path) -> dict[str, dict[str, int]]:
    """Answers and answer positions per category and split."""
    stats: dict[str, dict[str, int]] = {}
    for a in read_answers(folder):
        row = stats.setdefault(a.category, {"answers": 0, "positions": 0, "heldout": 0})
        row["answers"] += 1
        row["positions"] += len(a.answer)
        row["heldout"] += a.split == "heldout"
    return stats


def build_shards(
    model: LanguageModel,
    tokenizer: Tokenizer,
    seeds: SeedData,
    folder: Path,
    shards: range,
    settings: CorpusSettings,
    *,
    on_shard: Callable[[int, list[Answer]], None] | None = None,
) -> None:
    """Build the shards in ``shards`` that do not exist yet (resumable)."""
    if not tokenizer.has_chat_template:
        raise InvalidParameterError(
            "the corpus is built from chats: the tokenizer needs a chat template"
        )
    folder.mkdir(parents=True, exist_ok=True)
    writer = _Writer(tokenizer)
    for index in shards:
        path = _shard_path(folder, index)
        if path.exists():
            continue
        answers = _Shard(index, model, writer, seeds, settings).build()
        _save(path, answers, settings)
        if on_shard is not None:
            on_shard(index, answers)
