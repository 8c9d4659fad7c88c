"""Every bad input to every command and endpoint ends in one line, never a traceback.

Two tables, run in-process:

- the CLI: ``main(argv)`` returns 2 and prints exactly one line to stderr,
  ``spectune: error: ...`` naming the problem (argparse's usage errors included), with no
  ``Traceback``; every subcommand's ports, hosts, paths, numbers (0, negative, NaN, inf,
  64-bit overflow) and text encodings (lone surrogates, as undecodable argv bytes arrive).
- HTTP: each endpoint's fields, headers and bodies answer a 4xx in OpenAI's error shape
  ``{"error": {"message", "type", "param", "code"}}``.

Models load from a toy folder (``@T``), so a case that gets as far as loading costs
milliseconds; the real model is never needed here.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from spectune.cli import main
from spectune.drafters import NgramDrafter
from spectune.engines.costs import COSTS_FORMAT
from spectune.models.llama import LlamaLM
from spectune.models.loading import save_native
from spectune.models.toy import toy_model
from spectune.server import Limits, create_app
from spectune.server.engines import DraftSource, EngineSettings
from spectune.server.testing import toy_service, toy_tokenizer
from test_watch import canned

# -- the command line ----------------------------------------------------------------------

# (argv, a part of the message). Placeholders: @T a toy model folder (with a tokenizer),
# @W a scratch folder holding the files below, @BUSY a loopback port another socket holds,
# @BIN the URL of a loopback server that answers binary bytes, @DEAD one nothing answers.
# Every case fails before a model loads (or, at most, once the toy model has), so each
# costs milliseconds; a regression that starts the work shows as a slow case.
CLI_CASES: list[tuple[str, str]] = [
    # usage errors (argparse), any command
    ("bogus", "invalid choice: 'bogus'"),
    ("generate hi --max-tokens abc", "argument --max-tokens: invalid int value: 'abc'"),
    ("generate hi --dtype fp64", "argument --dtype: invalid choice"),
    ("generate hi --runtime bogus", "argument --runtime: invalid choice"),
    ("generate hi --policy bogus", "argument --policy: invalid choice"),
    ("generate hi --no-such-option", "unrecognized arguments: --no-such-option"),
    # generate: sampling numbers
    ("generate hi --temperature -1", "temperature must be >= 0"),
    ("generate hi --temperature nan", "temperature must be >= 0"),
    ("generate hi --temperature inf", "temperature must be <= 100"),
    ("generate hi --top-p 0", "top_p must be in (0, 1]"),
    ("generate hi --top-p 1.5", "top_p must be in (0, 1]"),
    ("generate hi --top-p nan", "top_p must be in (0, 1]"),
    ("generate hi --top-k -1", "top_k must be >= 0"),
    ("generate hi --max-tokens 0", "max_tokens must be >= 1"),
    ("generate hi --seed -1", "seed must be in [0, 2**63 - 1]"),
    ("generate hi --seed 99999999999999999999999", "seed must be in [0, 2**63 - 1]"),
    ("generate hi --stop=", "stop strings must be non-empty"),
    # generate: K, policies, trees
    ("generate hi --k 0", "K (draft tokens per step) must be in [1, 32]"),
    ("generate hi --k 500", "K (draft tokens per step) must be in [1, 32]"),
    ("generate hi --policy-file /nonexistent.toml", "cannot read policy file"),
    ("generate hi --policy-file @W/bad.jsonl", "policy"),
    ("generate hi --policy-opt nonsense", "--policy-opt wants key=value"),
    ("generate hi --tree-min-prob 0.5", "--tree-min-prob needs a tree"),
    ("generate hi --target @T --tree-width 0", "tree width must be in [1, 8]"),
    ("generate hi --target @T --tree-width 2 --tree-min-prob nan", "min_path_prob"),
    # generate: prompts and their text
    ("generate", "the prompt is empty"),
    ("generate ''", "the prompt is empty"),
    ("generate --chat '' --target @T", "the prompt is empty"),
    ("generate w1 --chat w2", "a raw prompt or --chat, not both"),
    ("generate w1 --system w2", "--system needs --chat"),
    ("generate --chat w1 --allow-special-tokens", "--allow-special-tokens applies to raw prompts"),
    ("generate $'w1 \\udcff' --target @T", "the prompt is not valid UTF-8"),
    ("generate --chat $'w1 \\ud800' --target @T", "--chat is not valid UTF-8"),
    ("generate --chat w1 --system $'\\udcc3' --target @T", "--system is not valid UTF-8"),
    # generate: model paths and files
    ("generate hi --target /nonexistent/model.gguf", "model not found: /nonexistent/model.gguf"),
    ("generate hi --target @W/corrupt.gguf", "cannot read GGUF file"),
    ("generate hi --target @W/no-weights", "no .safetensors weights"),
    ("generate hi --target @W/truncated", "cannot read"),
    ("generate hi --target @W/garbage.txt", "unsupported model file garbage.txt"),
    ("generate hi --target @T --draft /nonexistent", "model not found: /nonexistent"),
    ("generate hi --target @T --trace /nonexistent/dir/t.jsonl", "folder /nonexistent/dir does"),
    ("generate hi --target @T --trace @W", "--trace @W is a folder; give a file name"),
    ("generate hi --target @T --trace @W/toy/config.json", "is a file of the --target folder"),
    ("generate hi --target @T --policy-file @W/garbage.txt --trace @W/garbage.txt", "--policy-f"),
    ("generate hi --target @T --policy-file @W/binary.bin", "is not valid TOML"),
    ("generate hi --target @T --policy-file @W", "cannot read policy file"),
    # generate: a token tree on a target that cannot take one, refused before loading
    ("generate hi --compile --tree-width 2 --draft smollm2-draft --dtype fp32", "--compile do"),
    ("generate hi --compile --tree-nodes 8 --draft none", "and --compile do not go together"),
    ("generate hi --runtime llamacpp --tree-width 2", "not llamacpp"),
    # serve: the address, before any model loads
    ("serve --port 70000", "--port must be in [0, 65535], got 70000"),
    ("serve --port -1", "--port must be in [0, 65535], got -1"),
    ("serve --port abc", "argument --port: invalid int value"),
    ("serve --port @BUSY --target @T", "Address already in use"),
    ("serve --host 'not an address'", "--host 'not an address' is not an address here"),
    ("serve --host 999.1.1.1", "--host '999.1.1.1' is not an address here"),
    ("serve --host ''", "--host must be an address"),
    ("serve --host 192.0.2.1 --port 0", "cannot listen on 192.0.2.1:0"),
    # serve: engine, limits, names, files
    ("serve --max-batch 0", "max_batch must be >= 1"),
    ("serve --capacity 1", "capacity must be >= 2 tokens"),
    ("serve --speculate-max-batch -1", "speculate_max_batch must be >= 0"),
    ("serve --max-body-bytes 0", "max_body_bytes must be >= 1"),
    ("serve --max-prompt-tokens 0", "max_prompt_tokens must be >= 1"),
    ("serve --max-prompt-tokens 2048", "leaves no room for output in --capacity 2048"),
    ("serve --max-tokens 0", "max_tokens must be >= 1"),
    ("serve --default-max-tokens 0", "default_max_tokens must be in [1, max_tokens]"),
    ("serve --max-requests 0", "max_requests must be >= 1"),
    ("serve --threads 0", "--threads must be >= 1"),
    ("serve --draft-deadline -1", "draft_deadline must be a positive number"),
    ("serve --draft-deadline nan", "draft_deadline must be a positive number"),
    ("serve --engine bogus", "argument --engine: invalid choice"),
    ("serve --k 0", "K (draft tokens per step) must be in [1, 32]"),
    ("serve --port 0 --served-model-name ''", "--served-model-name must not be empty"),
    ("serve --port 0 --target /nonexistent", "model not found: /nonexistent"),
    ("serve --port 0 --target @W/corrupt.gguf", "cannot read GGUF file"),
    ("serve --port 0 --target @T --draft /nonexistent", "model not found: /nonexistent"),
    ("serve --port 0 --target @T --trace /nonexistent/dir/t.jsonl", "cannot write trace"),
    # bench
    ("bench --target /nonexistent", "model not found: /nonexistent"),
    ("bench --target @T --draft /nonexistent", "model not found: /nonexistent"),
    ("bench --target @T --draft ngram --temperatures abc", "--temperatures"),
    ("bench --target @T --draft ngram --temperatures -1", "temperatures must be >= 0"),
    ("bench --target @T --draft ngram --max-tokens 0", "--max-tokens and --repeats"),
    ("bench --target @T --draft ngram --repeats 0", "--max-tokens and --repeats"),
    ("bench --target @T --draft ngram --k 0", "K (draft tokens per step) must be in [1, 32]"),
    ("bench --target @T --draft ngram --k x", "--k"),
    ("bench --target @T --draft ngram --policies bogus", "unknown policies ['bogus']"),
    ("bench --target @T --draft ngram --trees bogus", "bogus"),
    ("bench --target @T --draft ngram --tree-k 0", "K (draft tokens per step)"),
    ("bench --target @T --draft ngram --systems bogus", "unknown systems"),
    ("bench --target @T --draft ngram --prompt-lookup-tokens 0", "--prompt-lookup-tokens"),
    ("bench --target @T --draft ngram --budget-minutes -1", "--budget-minutes"),
    ("bench --target @T --draft ngram --budget-minutes nan", "--budget-minutes"),
    ("bench --target @T --draft ngram --seed -1", "--seed must be in [0, 2**63 - 1]"),
    ("bench --target @T --draft ngram --out @W/garbage.txt", "is a file"),
    ("bench --target @T --draft ngram --out @W/garbage.txt/run", "garbage.txt is a file, not a"),
    ("bench --target @T --draft ngram --out /proc/spectune-bench", "cannot write in /proc"),
    # bench --baseline: a previous run's results.json, read (and checked) before the run
    ("bench --target @T --draft ngram --baseline @W/other.json", "no 'rows' list"),
    ("bench --target @T --draft ngram --baseline @W/rows-numbers.json", "a row is not an object"),
    ("bench --target @T --draft ngram --baseline @W/rows-no-all.json", "no row over all"),
    ("bench --target @T --draft ngram --baseline @W/rows-no-speed.json", "tokens_per_second"),
    ("bench --target @T --draft ngram --baseline @W/bad-timing.json", "measurements[0].seconds"),
    ("bench --target @T --draft ngram --baseline /nonexistent.json", "cannot read it"),
    ("bench --target @T --draft ngram --baseline @W", "cannot read it"),
    ("bench --target @T --draft ngram --baseline @W/binary.bin", "cannot read it"),
    ("bench --target @T --draft ngram --readme /nonexistent.md", "cannot read /nonexistent.md"),
    ("bench --target @T --draft ngram --readme @W/garbage.txt", "has no results block"),
    ("bench --target @T --draft ngram --prompts @W", "cannot read prompt file"),
    ("bench --target @T --draft ngram --prompts @W/binary.bin", "cannot read prompt file"),
    ("bench --target @T --draft ngram --threads 0", "--threads must be >= 1, got 0"),
    ("bench --target @T --draft ngram --prompts /nonexistent.jsonl", "not found"),
    ("bench --target @T --draft ngram --prompts @W/bad.jsonl", "bad.jsonl:1"),
    ("bench --target @T --draft ngram --categories bogus", "bogus"),
    ("bench --target @T --draft ngram --limit-per-category 0", "--limit-per-category"),
    # distill (every setting is checked before the target loads)
    ("distill --target @T", "required: --out"),
    ("distill --out @W/d --steps 1", "give either --corpus files or an --answers corpus"),
    ("distill --corpus @W/corpus.jsonl --answers @W --out @W/d --steps 1", "either --corpus"),
    ("distill --answers @W --out @W/d --steps 1 --target @T", "no answer shards in"),
    ("distill --answers @W --out @W/d --steps 1 --answer-shards 0", "--answer-shards must be"),
    ("distill --answers @W --out @W/d --steps 1 --unroll 0", "--unroll must be >= 1"),
    ("distill --answers @W --out @W/d --steps 1 --feature-layers x", "--feature-layers"),
    ("distill --answers @W --out @W/d --steps 1 --kind lm --feature-layers 0", "is for --kind"),
    ("distill --answers @W --out @W/d --steps 1 --feature-layers 1,0 --target @T", "ascending"),
    ("distill --answers @W --out @W/d --steps 1 --feature-layers 0,9 --target @T", "ascending"),
    # corpus
    ("corpus --target @T", "required: --out"),
    ("corpus --out @W/c --shards 5:2", "start:stop[:step]"),
    ("corpus --out @W/c --shards x", "start:stop[:step]"),
    ("corpus --out @W/c --shards 0:4:0", "start:stop[:step]"),
    ("corpus --out @W/c --items-per-shard 0", "--items-per-shard must be >= 1"),
    ("corpus --out @W/c --max-answer-tokens 0", "--max-answer-tokens must be >= 1"),
    ("corpus --out @W/c --batch 0", "--batch must be >= 1"),
    ("corpus --out @W/c --threads 0", "--threads must be >= 1"),
    ("corpus --out @W/garbage.txt", "is a file"),
    ("corpus --out @W/c --seeds /nonexistent.jsonl", "seed file not found"),
    ("corpus --out @W/c --seeds @W/bad.jsonl", "bad.jsonl:1"),
    ("corpus --out @W/c --target /nonexistent", "model not found: /nonexistent"),
    ("corpus --out /nonexistent/corpus --stats", "corpus folder not found"),
    ("corpus --out @W/c --seeds @W/binary.bin", "binary.bin: 'utf-8' codec can't decode"),
    ("corpus --out @W/garbage.txt/sub", "garbage.txt is a file, not a folder"),
    ("corpus --out /proc/spectune-corpus", "cannot write in /proc"),
    ("distill --corpus @W/corpus.jsonl --out @W/d --steps 0", "give a budget"),
    ("distill --corpus @W/corpus.jsonl --out @W/d --minutes nan", "finite and >= 0"),
    ("distill --corpus @W/corpus.jsonl --out @W/d --tokens -5", "finite and >= 0"),
    ("distill --corpus @W/corpus.jsonl --out @W/d --steps 1 --layers 0", "layers must be >= 1"),
    ("distill --corpus @W/corpus.jsonl --out @W/d --steps 1 --heads 3", "multiple of its 3 heads"),
    ("distill --corpus @W/corpus.jsonl --out @W/d --steps 1 --kv-heads 3", "3 kv heads"),
    ("distill --corpus @W/corpus.jsonl --out @W/d --steps 1 --ffn 0", "ffn must be >= 1"),
    ("distill --corpus @W/corpus.jsonl --out @W/d --steps 1 --generate -1", "--generate"),
    ("distill --corpus @W/corpus.jsonl --out @W/d --steps 1 --max-new-tokens 0", "max_new"),
    ("distill --corpus @W/corpus.jsonl --out @W/d --steps 1 --gen-batch 0", "batch_size"),
    ("distill --corpus @W/corpus.jsonl --out @W/d --steps 1 --lr nan", "learning rate"),
    ("distill --corpus @W/corpus.jsonl --out @W/d --steps 1 --batch-tokens 0", "batch_tokens"),
    ("distill --corpus @W/corpus.jsonl --out @W/d --steps 1 --eval-every 0", "eval_every"),
    ("distill --corpus @W/corpus.jsonl --out @W/d --steps 1 --heldout 0", "--heldout"),
    ("distill --corpus @W/corpus.jsonl --out @W/d --steps 1 --threads 0", "--threads"),
    ("distill --corpus @W/corpus.jsonl --out @W/d --steps 1 --seed -1", "seed must be in"),
    ("distill --corpus @W/corpus.jsonl --out @W/d --steps 1 --vocab-size 0", "--vocab-size"),
    ("distill --corpus @W/corpus.jsonl --out @W/garbage.txt --steps 1", "is a file"),
    ("distill --corpus @W/corpus.jsonl --out @W/d --steps 1 --cache-dir @W/garbage.txt", "file"),
    ("distill --corpus /nonexistent.jsonl --out @W/d --steps 1 --target @T", "not found"),
    ("distill --corpus @W/bad.jsonl --out @W/d --steps 1 --target @T", "bad.jsonl:1"),
    # distill: the corpus files are read, and the folders checked, before the target loads
    ("distill --corpus @W/binary.bin --out @W/d --steps 1", "binary.bin: 'utf-8' codec"),
    ("distill --corpus @W/binary.jsonl --out @W/d --steps 1", "binary.jsonl: 'utf-8' codec"),
    ("distill --corpus @W/bad.jsonl --out @W/d --steps 1", "bad.jsonl:1"),
    ("distill --corpus @W/binary.jsonl --out @W/d --steps 1 --generate 0 --reference 4", "'utf"),
    ("distill --corpus @W/corpus.jsonl --out @W/d --steps 1 --cache-dir /proc/c", "cannot write"),
    ("distill --corpus @W/corpus.jsonl --out @W/garbage.txt/d --steps 1", "garbage.txt is a fi"),
    ("distill --corpus @W/corpus.jsonl --out /proc/spectune-d --steps 1", "cannot write in /pr"),
    ("distill --answers @W --out @W --steps 1", "is the --answers input"),
    # tune (every setting is checked before a model loads)
    ("tune --trace /nonexistent.jsonl", "cannot read trace /nonexistent.jsonl"),
    ("tune --trace @W/bad.jsonl", "bad.jsonl:1: not a spectune trace event"),
    ("tune --trace @W/plain-trace.jsonl", "no chain draft steps"),
    ("tune --trace @W/hot-trace.jsonl", "temperature must be a number >= 0"),
    ("tune --trace @W/plain-trace.jsonl --draft ngram", "--trace files to replay, or --draft"),
    ("tune --temperatures x", "--temperatures: expected comma-separated numbers"),
    ("tune --temperatures -1", "temperature must be >= 0"),
    ("tune --max-tokens 1", "--max-tokens must be >= 2"),
    ("tune --record-k 0", "K (draft tokens per step) must be in [1, 32]"),
    ("tune --confirm-prompts -1", "--confirm-prompts must be >= 0"),
    ("tune --limit-per-category 0", "--limit-per-category must be at least 1"),
    ("tune --threads 0", "--threads must be >= 1"),
    ("tune --trace @W/plain-trace.jsonl --out @W", "is a folder"),
    ("tune --trace @W/plain-trace.jsonl --out @W/plain-trace.jsonl", "is the --trace input"),
    ("tune --trace @W/plain-trace.jsonl --report @W/plain-trace.jsonl", "is the --trace input"),
    ("tune --trace @W/plain-trace.jsonl --out @W/trace-link.jsonl", "is the --trace input"),
    ("tune --trace @W/plain-trace.jsonl --out @W/p.toml --report @W/p.toml", "also the --out"),
    ("tune --trace @W/plain-trace.jsonl --out @W/garbage.txt/p.toml", "garbage.txt is a file"),
    ("tune --trace @W/plain-trace.jsonl --out /nonexistent/p.toml", "does not exist"),
    ("tune --trace @W/plain-trace.jsonl --out /proc/p.toml", "cannot write in /proc"),
    ("tune --trace @W/binary.bin", "not UTF-8 text"),
    ("tune --trace @W", "cannot read trace"),
    ("tune --target @T --draft ngram --prompts @W", "cannot read prompt file"),
    # tune --engine llamacpp: the server binary is checked before anything starts
    ("tune --engine llamacpp --target @W/corrupt.gguf --server-binary @W/garbage.txt", "is not ex"),
    ("tune --engine llamacpp --target @W/corrupt.gguf --server-binary /nonexistent", "no llama-se"),
    ("tune --engine llamacpp --target @W/corrupt.gguf --server-binary @W", "is a folder, not a"),
    (
        "tune --engine llamacpp --server-binary @W/no-program.sh --target @W/corrupt.gguf "
        "--draft ngram --limit-per-category 1 --confirm-prompts 1",
        "cannot start @W/no-program.sh: Exec format error",
    ),
    ("tune --target @T --draft none", "tuning needs a drafter"),
    ("tune --target @T --draft ngram --prompts @W/bad.jsonl", "bad.jsonl:1"),
    # --policy-file on the other commands that decode
    ("bench --target @T --draft ngram --policy-file /nonexistent.toml", "cannot read policy file"),
    ("bench --target @T --draft ngram --policy-file @W/bad.jsonl", "is not valid TOML"),
    ("serve --policy-file /nonexistent.toml", "cannot read policy file"),
    # select
    ("select ngram --per-category 0", "--per-category must be at least 1"),
    ("select ngram --max-k 0", "K (draft tokens per step) must be in [1, 32]"),
    ("select ngram --max-k 99", "K (draft tokens per step) must be in [1, 32]"),
    ("select ngram --extra-k 0", "K (draft tokens per step)"),
    ("select ngram --continuation-tokens 0", "continuation_tokens must be >= 1"),
    ("select ngram --confirm-prompts 0", "confirm_prompts must be >= 1"),
    ("select ngram --confirm-tokens 0", "confirm_tokens must be >= 1"),
    ("select ngram --report-dir @W/garbage.txt", "is a file"),
    ("select /nonexistent --target @T", "model not found: /nonexistent"),
    ("select ngram --target /nonexistent", "model not found: /nonexistent"),
    ("select ngram --target @T --prompts /nonexistent.jsonl", "not found"),
    ("select ngram --target @T --prompts @W/bad.jsonl", "bad.jsonl:1"),
    ("select ngram --target @T --split bogus", "no prompts left"),
    ("select ngram --target @T --out @W/garbage.txt/sub", "garbage.txt is a file, not a folder"),
    ("select ngram --target @T --out /proc/spectune-select", "cannot write in /proc"),
    ("select ngram --target @T --prompts @W", "cannot read prompt file"),
    ("select ngram --target @T --prompts @W/binary.bin", "cannot read prompt file"),
    # advise: the report folder and the traffic, before any model loads
    ("advise --target @T --draft ngram --out @W/garbage.txt", "is a file; give a folder"),
    ("advise --target @T --draft ngram --out @W/garbage.txt/sub", "garbage.txt is a file, not a"),
    ("advise --target @T --draft ngram --out /proc/spectune-advise", "cannot write in /proc"),
    ("advise --target @T --draft ngram --traces /nonexistent", "no such file or folder"),
    ("advise --target @T --draft ngram --traces @W/garbage.txt", "not a spectune trace event"),
    ("advise --target @T --draft ngram --traces @W/binary.bin", "not UTF-8 text"),
    ("advise --target @T --draft ngram --prompts @W", "cannot read prompt file"),
    # experiment
    ("experiment bogus", "invalid choice: 'bogus'"),
    ("experiment tree --toy --per-category 0", "--per-category must be >= 1"),
    ("experiment tree --toy --max-tokens 0", "--max-tokens must be >= 1"),
    ("experiment tree --toy --budgets x", "comma-separated integers"),
    ("experiment tree --toy --widths 0", "values must be >= 1"),
    ("experiment tree --toy --temperatures x", "comma-separated numbers"),
    ("experiment batch --toy --sizes 0", "values must be >= 1"),
    ("experiment chunked --toy --ks 0", "values must be >= 1"),
    ("experiment tree --target /nonexistent", "model not found: /nonexistent"),
    # experiment --out: checked before the setup loads
    ("experiment tree --toy --out @W", "--out @W is a folder; give a file name"),
    ("experiment tree --toy --out @W/garbage.txt/x.json", "garbage.txt is a file, not a"),
    ("experiment batch --toy --out @W", "is a folder; give a file name"),
    ("experiment chunked --toy --out /proc/x.json", "cannot write in /proc"),
    ("experiment history --toy --out @W/garbage.txt/x.json", "garbage.txt is a file, not a"),
    ("experiment runtimes --toy --out @W", "is a folder; give a file name"),
    ("experiment tree --out @W", "is a folder; give a file name"),  # before the target
    # experiment evidence: every check before any stage runs (and writes its file)
    ("experiment evidence --toy --out-dir @W/ev --stages bogus", "--stages: unknown ['bogus']"),
    ("experiment evidence --toy --out-dir @W/ev --distill-minutes 0", "--distill-minutes must"),
    ("experiment evidence --toy --out-dir @W/ev --draft-sizes 4by256", "LAYERSxHIDDEN"),
    ("experiment evidence --toy --out-dir @W/ev --tune-report /nonexistent", "no such file"),
    ("experiment evidence --toy --out-dir @W/ev --tune-report @W/garbage.txt", "is not JSON"),
    ("experiment evidence --toy --out-dir @W/ev --tune-report @W/binary.bin", "is not JSON"),
    ("experiment evidence --toy --out-dir @W/ev --tune-report @W/list.json", "not a `spectune"),
    ("experiment evidence --toy --tune-report @W/garbage.txt", "is not JSON"),  # the default dir
    ("experiment evidence --toy --out-dir @W/garbage.txt", "is a file; give a folder"),
    ("experiment evidence --toy --out-dir @W/garbage.txt/ev", "garbage.txt is a file, not a"),
    ("experiment evidence --toy --out-dir /proc/spectune-ev", "cannot write in /proc"),
    ("experiment evidence --toy --out-dir @W/ev --report @W", "--report @W is a folder"),
    ("experiment evidence --toy --out-dir @W/ev --report /proc/ev.md", "cannot write in /proc"),
    ("experiment evidence --toy --out-dir @W/ev --out @W/ev.json", "not --out"),
    ("experiment evidence --toy --out-dir @W/stale --stages tree", "is not a stage record"),
    ("experiment evidence --out-dir @W/ev --answers @W/none --stages drafts", "no answer corpus"),
    ("experiment history --toy --per-category 0", "--per-category must be >= 1"),
    ("experiment runtimes --toy --max-tokens 0", "--max-tokens must be >= 1"),
    # suffix-index
    ("suffix-index /nonexistent -o @W/i.npz", "no corpus at /nonexistent"),
    ("suffix-index @W/bad.jsonl -o @W/i.npz", "bad.jsonl:1"),
    ("suffix-index @W -o @W/i.npz --split bogus", "argument --split: invalid choice"),
    ("suffix-index @W -o @W/i.npz --max-depth 0", "--max-depth must be >= 1"),
    ("suffix-index @W -o @W/i.npz --max-tokens 0", "--max-tokens must be >= 1"),
    ("suffix-index @W -o @W", "is a folder"),
    ("suffix-index @W -o @W/i.npz", "no answers to index"),
    ("suffix-index @W/tokens.jsonl -o @W/tokens.jsonl", "is the corpus input"),
    ("suffix-index @W/tokens.jsonl -o @W/garbage.txt/i.npz", "garbage.txt is a file, not a"),
    ("suffix-index @W/tokens.jsonl -o /proc/i.npz", "cannot write in /proc"),
    ("suffix-index @W/binary.bin -o @W/i.npz", "cannot read"),
    # devices and precisions, any model-loading command
    ("generate hi --device tpu", "argument --device: invalid choice"),
    ("generate hi --device cuda --target @T", "cuda"),
    ("generate hi --dtype int4 --device cuda --target @T", "cuda"),
    # report
    ("report /nonexistent.jsonl", "cannot read trace"),
    ("report @W/garbage.txt", "garbage.txt:1"),
    ("report @W", "cannot read trace"),
    ("report @W/garbage.txt --window 0", "--window must be >= 1"),
    ("report @W/binary.bin", "not UTF-8 text"),
    ("report @W/plain-trace.jsonl --out @W/garbage.txt", "is a file; give a folder"),
    ("report @W/plain-trace.jsonl --out @W/plain-trace.jsonl", "is a file; give a folder"),
    ("report @W/plain-trace.jsonl --out @W/garbage.txt/sub", "garbage.txt is a file, not a"),
    ("report @W/plain-trace.jsonl --out /proc/spectune-report", "cannot write in /proc"),
    # watch: the URL before the first poll, what a server sends quoted short and escaped
    ("watch 'http://[::1' --once", "is not a valid URL"),
    ("watch ftp://host --once", "ftp://host is not an http(s) URL"),
    ("watch http:// --once", "is not an http(s) URL"),
    ("watch http://host:99999 --once", "port 99999 is not in [1, 65535]"),
    ("watch @DEAD --once --api-key $'k\\u00e9y'", "--api-key must be printable ASCII"),
    ("watch @BIN --once", "not Prometheus text"),
    ("watch @BIN --once --json", "not Prometheus text"),
    ("watch @DEAD --polls 2 --interval 0.01", "all 2 polls failed; the last: cannot connect"),
    ("watch @DEAD --polls 2 --interval 0.01 --json", "all 2 polls failed"),
    # watch --costs: a cost profile, read before the first poll
    ("watch @DEAD --once --costs /nonexistent.json", "cannot read the cost profile"),
    ("watch @DEAD --once --costs @W", "cannot read the cost profile"),
    ("watch @DEAD --once --costs @W/binary.bin", "is not a cost profile (not UTF-8 text)"),
    ("watch @DEAD --once --costs @W/garbage.txt", "garbage.txt is not JSON"),
    ("watch @DEAD --once --costs @W/other.json", "is not a cost profile"),
    ("watch @DEAD --once --costs @W/costs-short.json", "verify must start at 1.0"),
    ("watch @DEAD --once --costs @W/garbage.txt --draft-cost 0.1", "not both"),
    ("watch @DEAD --once --draft-cost 0.1", "--draft-cost and --verify-slope go together"),
    ("watch @DEAD --once --verify-slope 0.1", "--draft-cost and --verify-slope go together"),
    ("watch @DEAD --once --draft-cost nan --verify-slope 0.1", "finite and >= 0"),
    ("watch @DEAD --once --draft-cost 0.1 --verify-slope -1", "finite and >= 0"),
    ("watch @DEAD --once --max-k 99", "K (draft tokens per step) must be in [1, 32]"),
    # files other commands read
    ("serve --port 0 --target @T --trace @W", "cannot write trace"),
    ("serve --port 0 --target @T --api-keys /nonexistent", "cannot read API keys"),
    ("serve --port 0 --target @T --api-keys @W", "cannot read API keys"),
    ("serve --policy-file @W/binary.bin", "is not valid TOML"),
    ("corpus --out @W/c --seeds @W", "seed file not found"),
    ("distill --corpus @W --out @W/d --steps 1 --target @T", "corpus file not found"),
    ("distill --answers @W/garbage.txt --out @W/d --steps 1 --target @T", "no answer shards"),
    ("experiment evidence --toy --out-dir @W/ev --tune-report @W", "no such file"),
    # export
    ("export --to bogus", "argument --to: unknown engine 'bogus'"),
    ("export --to vllm", ""),
    ("export /nonexistent.json --to vllm", "/nonexistent.json"),
    ("export @W/garbage.txt --to vllm", "garbage.txt"),
    ("export --to vllm --target x --draft y --k 0", "nothing to export"),
]


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    work = tmp_path_factory.mktemp("bad-input")
    toy = work / "toy"
    save_native(toy_model(0), toy)
    toy_tokenizer(toy)
    (work / "bad.jsonl").write_text("{not json\n")
    (work / "garbage.txt").write_text("hello\n")
    plain_step = (
        '{"event":"step","request":"0","index":0,"k":0,"drafted":0,"accepted":0,'
        '"emitted":[1],"draft_time":0,"target_time":0.01,"step_time":0.01}\n'
    )
    (work / "plain-trace.jsonl").write_text(plain_step)
    (work / "trace-link.jsonl").symlink_to(work / "plain-trace.jsonl")  # one file, two names
    hot = '{"event":"request","request":"0","info":{"temperature":"hot"}}\n'
    (work / "hot-trace.jsonl").write_text(hot + plain_step)
    (work / "corpus.jsonl").write_text('{"text": "w1 w2 w3"}\n')
    (work / "corrupt.gguf").write_bytes(b"GGUF" + b"\x00garbage" * 10)
    (work / "binary.bin").write_bytes(BINARY)
    (work / "binary.jsonl").write_bytes(BINARY)
    (work / "list.json").write_text("[1, 2]\n")
    (work / "costs-short.json").write_text(
        json.dumps({"format": COSTS_FORMAT, "version": 1, "draft_cost": 0.1, "verify": [1.0]})
    )
    (work / "stale").mkdir()  # an evidence folder whose stage file was cut short
    (work / "stale" / "stage-costs.json").write_text('{"stage": "costs", "sett')
    (work / "tokens.jsonl").write_text("[1, 2, 3]\n[4, 5, 6]\n")
    program = work / "no-program.sh"  # executable, but neither a binary nor a #! script
    program.write_text("not a program\n")
    program.chmod(0o755)
    for name, results in BASELINES.items():
        (work / name).write_text(json.dumps(results))
    for name in ("no-weights", "truncated"):
        save_native(toy_model(0), work / name)
    (work / "no-weights" / "model.safetensors").unlink()
    weights = work / "truncated" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    with socket.socket() as dead:  # a port nothing listens on
        dead.bind(("127.0.0.1", 0))
        dead_port = dead.getsockname()[1]
    with canned(BINARY.decode("latin-1")) as server:  # every byte value, as text
        yield {
            "@T": str(toy),
            "@W": str(work),
            "@BUSY": str(busy.getsockname()[1]),
            "@BIN": server + "/metrics",
            "@DEAD": f"http://127.0.0.1:{dead_port}",
        }
    busy.close()


# Bytes a misdirected URL or file may hold: every byte value, a terminal escape, a CR.
BINARY = bytes(range(256)) * 4 + b"\x1b[31mred\x1b[0m\r"

_ROW = {"system": "spectune plain", "dtype": "fp32", "temperature": 0.0, "category": "all"}
# Valid JSON that is not a benchmark's results.json, as far as --baseline reads it.
BASELINES = {
    "other.json": {"results": []},
    "rows-numbers.json": {"rows": [1, 2]},
    "rows-no-all.json": {"rows": [{**_ROW, "category": "code"}]},
    "rows-no-speed.json": {"rows": [_ROW]},
    "bad-timing.json": {
        "rows": [{**_ROW, "tokens_per_second": 10.0, "speedup_vs_plain": 1.0}],
        "measurements": [{**_ROW, "prompt_id": "a", "tokens": [1, 2], "seconds": "0.1"}],
    },
}


def split_argv(line: str, places: dict[str, str]) -> list[str]:
    """Words of ``line`` (quotes as a shell; ``$'...'`` decodes \\u escapes, so lone
    surrogates stand for undecodable bytes), placeholders filled in."""
    import shlex

    words = []
    for word in shlex.split(line.replace("$'", "'$")):
        if word.startswith("$"):
            word = word[1:].encode("ascii").decode("unicode_escape")
        for key, value in places.items():
            word = word.replace(key, value)
        words.append(word)
    return words


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    import torch

    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)  # ``--threads`` cases must not leak


def files_under(folder: Path) -> dict[Path, tuple[int, int]]:
    """Every file under ``folder`` (none where it does not exist), with its modification
    time and size."""
    return {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize(("line", "message"), CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_cli(
    line: str, message: str, scratch: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    # ``experiment evidence`` writes its stages into docs/evidence unless told otherwise:
    # a bad input must fail before the first stage, not after it replaced measured files.
    evidence = Path("docs/evidence")
    before = files_under(evidence) if line.startswith("experiment") else None
    status = main(split_argv(line, scratch))
    if before is not None:
        assert files_under(evidence) == before, "the case wrote into docs/evidence"
    captured = capsys.readouterr()
    err = captured.err
    assert status == 2, (status, err[-500:])
    assert "Traceback" not in err + captured.out
    assert err.startswith("spectune: error: ") and err.count("\n") == 1, err
    assert err[:-1].isprintable(), err  # nothing a file or server sent reaches the terminal raw
    for key, value in scratch.items():
        message = message.replace(key, value)
    assert message in err


# -- HTTP ----------------------------------------------------------------------------------

LIMITS = Limits(
    max_body_bytes=4096, max_prompt_tokens=32, max_tokens=8, default_max_tokens=4, max_requests=4
)
CHAT = {"model": "toy", "messages": [{"role": "user", "content": "w1 w2"}], "max_tokens": 2}
COMPLETION = {"model": "toy", "prompt": "w1 w2", "max_tokens": 2}

# (method, path, JSON body (or raw bytes), extra headers, status, param or None)
HTTP_CASES: list[tuple[str, str, object, dict[str, str], int, str | None]] = [
    # the body itself
    ("POST", "/v1/chat/completions", b"{not json", {}, 400, None),
    ("POST", "/v1/chat/completions", b"[1, 2]", {}, 400, None),
    ("POST", "/v1/chat/completions", b"", {}, 400, None),
    ("POST", "/v1/chat/completions", b'{"model": "toy\xff"}', {}, 400, None),
    ("POST", "/v1/completions", b"x" * 5000, {}, 413, None),
    ("POST", "/v1/completions", COMPLETION, {"content-type": "text/plain"}, 400, None),
    ("POST", "/v1/completions", COMPLETION, {"content-length": "abc"}, 400, None),
    # the model
    ("POST", "/v1/completions", {**COMPLETION, "model": "other"}, {}, 404, "model"),
    ("POST", "/v1/completions", {**COMPLETION, "model": 5}, {}, 400, "model"),
    ("POST", "/v1/completions", {"prompt": "w1"}, {}, 400, "model"),
    # the prompt
    ("POST", "/v1/completions", {**COMPLETION, "prompt": ""}, {}, 400, "prompt"),
    ("POST", "/v1/completions", {**COMPLETION, "prompt": []}, {}, 400, "prompt"),
    ("POST", "/v1/completions", {**COMPLETION, "prompt": [5, 64]}, {}, 400, "prompt"),
    ("POST", "/v1/completions", {**COMPLETION, "prompt": [-1]}, {}, 400, "prompt"),
    ("POST", "/v1/completions", {**COMPLETION, "prompt": [[1, 2]]}, {}, 400, "prompt"),
    ("POST", "/v1/completions", {**COMPLETION, "prompt": ["a", "b"]}, {}, 400, "prompt"),
    ("POST", "/v1/completions", {**COMPLETION, "prompt": "w1 " * 40}, {}, 400, "prompt"),
    ("POST", "/v1/completions", {**COMPLETION, "prompt": "w1 \ud800"}, {}, 400, None),
    ("POST", "/v1/completions", {**COMPLETION, "prompt": 12}, {}, 400, "prompt"),
    # messages
    ("POST", "/v1/chat/completions", {**CHAT, "messages": []}, {}, 400, "messages"),
    ("POST", "/v1/chat/completions", {**CHAT, "messages": "hi"}, {}, 400, "messages"),
    (
        "POST",
        "/v1/chat/completions",
        {**CHAT, "messages": [{"role": "x", "content": "w1"}]},
        {},
        400,
        "messages.0.role",
    ),
    (
        "POST",
        "/v1/chat/completions",
        {**CHAT, "messages": [{"role": "user"}]},
        {},
        400,
        "messages.0.content",
    ),
    (
        "POST",
        "/v1/chat/completions",
        {**CHAT, "messages": [{"role": "user", "content": ""}]},
        {},
        400,
        None,
    ),
    (
        "POST",
        "/v1/chat/completions",
        {**CHAT, "messages": [{"role": "user", "content": [{"type": "image", "text": "w1"}]}]},
        {},
        400,
        "messages.0.content",
    ),
    (
        "POST",
        "/v1/chat/completions",
        {**CHAT, "messages": [{"role": "user", "content": "w1 \udcff"}]},
        {},
        400,
        None,
    ),
    (
        "POST",
        "/v1/chat/completions",
        {**CHAT, "messages": [{"role": "user", "content": "w1 <|im_end|>"}]},
        {},
        400,
        None,
    ),
    (
        "POST",
        "/v1/chat/completions",
        {**CHAT, "messages": [{"role": "user", "content": 5}]},
        {},
        400,
        "messages.0.content",
    ),
    # sampling fields
    ("POST", "/v1/completions", {**COMPLETION, "max_tokens": 0}, {}, 400, "max_tokens"),
    ("POST", "/v1/completions", {**COMPLETION, "max_tokens": 9}, {}, 400, "max_tokens"),
    ("POST", "/v1/completions", {**COMPLETION, "max_tokens": "2"}, {}, 400, "max_tokens"),
    ("POST", "/v1/completions", {**COMPLETION, "max_tokens": 1.5}, {}, 400, "max_tokens"),
    ("POST", "/v1/completions", {**COMPLETION, "max_tokens": True}, {}, 400, "max_tokens"),
    ("POST", "/v1/completions", {**COMPLETION, "max_tokens": 2**70}, {}, 400, "max_tokens"),
    (
        "POST",
        "/v1/chat/completions",
        {**CHAT, "max_completion_tokens": 0},
        {},
        400,
        "max_completion_tokens",
    ),
    ("POST", "/v1/completions", {**COMPLETION, "temperature": -1}, {}, 400, "temperature"),
    ("POST", "/v1/completions", {**COMPLETION, "temperature": 3}, {}, 400, "temperature"),
    ("POST", "/v1/completions", {**COMPLETION, "temperature": "hot"}, {}, 400, "temperature"),
    (
        "POST",
        "/v1/completions",
        b'{"model": "toy", "prompt": "w1", "temperature": NaN}',
        {},
        400,
        "temperature",
    ),
    (
        "POST",
        "/v1/completions",
        b'{"model": "toy", "prompt": "w1", "top_p": Infinity}',
        {},
        400,
        "top_p",
    ),
    ("POST", "/v1/completions", {**COMPLETION, "top_p": 0}, {}, 400, "top_p"),
    ("POST", "/v1/completions", {**COMPLETION, "top_k": -1}, {}, 400, "top_k"),
    ("POST", "/v1/completions", {**COMPLETION, "stop": ""}, {}, 400, "stop"),
    ("POST", "/v1/completions", {**COMPLETION, "stop": ["a"] * 5}, {}, 400, "stop"),
    ("POST", "/v1/completions", {**COMPLETION, "stop": [1]}, {}, 400, "stop"),
    ("POST", "/v1/completions", {**COMPLETION, "seed": -1}, {}, 400, "seed"),
    ("POST", "/v1/completions", {**COMPLETION, "seed": 2**64}, {}, 400, "seed"),
    ("POST", "/v1/completions", {**COMPLETION, "stream": "yes"}, {}, 400, "stream"),
    (
        "POST",
        "/v1/completions",
        {**COMPLETION, "stream_options": {"include_usage": 1}},
        {},
        400,
        "stream_options.include_usage",
    ),
    ("POST", "/v1/completions", {**COMPLETION, "n": 2}, {}, 400, "n"),
    ("POST", "/v1/completions", {**COMPLETION, "presence_penalty": 1}, {}, 400, "presence_penalty"),
    ("POST", "/v1/completions", {**COMPLETION, "echo": True}, {}, 400, "echo"),
    ("POST", "/v1/completions", {**COMPLETION, "logprobs": 2}, {}, 400, "logprobs"),
    ("POST", "/v1/completions", {**COMPLETION, "best_of": 2}, {}, 400, "best_of"),
    ("POST", "/v1/completions", {**COMPLETION, "suffix": "x"}, {}, 400, "suffix"),
    ("POST", "/v1/chat/completions", {**CHAT, "logprobs": True}, {}, 400, "logprobs"),
    # spectune's extension object
    (
        "POST",
        "/v1/completions",
        {**COMPLETION, "spectune": {"policy": "bogus"}},
        {},
        400,
        "spectune.policy",
    ),
    ("POST", "/v1/completions", {**COMPLETION, "spectune": {"k": 99}}, {}, 400, "spectune.k"),
    (
        "POST",
        "/v1/completions",
        {**COMPLETION, "spectune": {"drafter": "other"}},
        {},
        400,
        "spectune.drafter",
    ),
    (
        "POST",
        "/v1/completions",
        {**COMPLETION, "spectune": {"off": "yes"}},
        {},
        400,
        "spectune.off",
    ),
    ("POST", "/v1/completions", {**COMPLETION, "spectune": "fast"}, {}, 400, "spectune"),
    (
        "POST",
        "/v1/chat/completions",
        {**CHAT, "spectune": {"allow_special_tokens": True}},
        {},
        400,
        "spectune.allow_special_tokens",
    ),
    (
        "POST",
        "/v1/completions",
        {**COMPLETION, "spectune": {"allow_special_tokens": 1}},
        {},
        400,
        "spectune.allow_special_tokens",
    ),
    # paths and methods
    ("GET", "/v1/completions", None, {}, 405, None),
    ("POST", "/v1/models", None, {}, 405, None),
    ("GET", "/v1/nothing", None, {}, 404, None),
]
# The same requests with a key required: a missing or wrong key is a 401 first.
AUTH_CASES: list[tuple[str, str, dict[str, str]]] = [
    ("POST", "/v1/completions", {}),
    ("POST", "/v1/chat/completions", {"authorization": "Bearer wrong"}),
    ("GET", "/v1/models", {"authorization": "Basic c2VjcmV0"}),
    ("GET", "/metrics", {"authorization": "Bearer"}),
]


def _client(target: LlamaLM, folder: Path, api_key: str | None = None) -> TestClient:
    service = toy_service(
        target,
        toy_tokenizer(folder),
        draft=DraftSource(NgramDrafter()),
        engine=EngineSettings(max_batch=2, capacity=64),
        limits=LIMITS,
        api_key=api_key,
    )
    return TestClient(create_app(service), raise_server_exceptions=False)


@pytest.fixture(scope="module")
def http(toy_target: LlamaLM, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    with _client(toy_target, tmp_path_factory.mktemp("bad-http")) as client:
        yield client


def _send(
    client: TestClient, method: str, path: str, body: object, headers: dict[str, str]
) -> tuple[int, dict[str, object]]:
    if isinstance(body, bytes):
        content = body
        headers = {"content-type": "application/json", **headers}
    elif body is None:
        content = None
    else:
        # ensure_ascii keeps lone surrogates as \\u escapes, as a client in another
        # language may send them.
        content = json.dumps(body).encode()
        headers = {"content-type": "application/json", **headers}
    reply = client.request(method, path, content=content, headers=headers)
    return reply.status_code, reply.json()


def _assert_openai_error(status: int, body: dict[str, object], expected: int) -> None:
    assert status == expected, body
    assert set(body) == {"error"}, body
    error = body["error"]
    assert isinstance(error, dict) and set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert "Traceback" not in error["message"] and "\n" not in error["message"]
    assert error["type"] in ("invalid_request_error", "authentication_error", "rate_limit_error")


@pytest.mark.parametrize(
    ("method", "path", "body", "headers", "status", "param"),
    HTTP_CASES,
    ids=[f"{c[0]} {c[1]} {json.dumps(c[2], default=repr)[:60]}" for c in HTTP_CASES],
)
def test_http(
    http: TestClient,
    method: str,
    path: str,
    body: object,
    headers: dict[str, str],
    status: int,
    param: str | None,
) -> None:
    got, reply = _send(http, method, path, body, headers)
    _assert_openai_error(got, reply, status)
    if param is not None:
        assert reply["error"]["param"] == param, reply  # type: ignore[index]


def test_http_auth(toy_target: LlamaLM, tmp_path: Path) -> None:
    with _client(toy_target, tmp_path, api_key="secret") as client:
        for method, path, headers in AUTH_CASES:
            body = COMPLETION if method == "POST" else None
            got, reply = _send(client, method, path, body, headers)
            _assert_openai_error(got, reply, 401)
        ok = client.get("/v1/models", headers={"authorization": "Bearer secret"})
        assert ok.status_code == 200  # the key itself works: the 401s meant something


def test_http_still_serves(http: TestClient) -> None:
    """After every bad request, good ones are still answered."""
    for path, body in (("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT)):
        reply = http.post(path, json=body)
        assert reply.status_code == 200, reply.text
    assert http.get("/health").json()["status"] == "ok"
