"""The record on disk, one type per field: what ``trajectories.jsonl`` and
``trajectories.parquet`` hold (docs/rollout.md#the-record-format).

A record keeps what the model saw and did, as it saw it: ``messages`` are the messages sent and
the replies received, under the tool names the model was offered (``kvstore_1_0_0__put``), and
``tools`` the tool schemas offered; ``tool_names`` maps each offered name to the environment's
(``kvstore@1.0.0/put``) beside them, never over them. Each turn keeps the token ids and
log-probabilities the endpoint returned (OpenAI's ``logprobs.content``, vLLM's and SGLang's
``prompt_token_ids`` and ``token_ids``).

Every field has one type in every record, so the JSONL reads as a table
(``pyarrow.json.read_json``) and the Parquet file has real nested columns (lists of structs,
:func:`arrow_schema`): a message is ``role``, ``content`` (text or null), ``tool_calls``,
``tool_call_id``, ``name`` and ``extra`` (the JSON text of any other field it had: a list
``content``, ``reasoning_content``, ...); a step's ``arguments_json`` and ``structured_json`` are
JSON text, as the free-form ``task``, ``reward_components`` and ``tools`` are in Parquet.
:func:`chat_messages` gives the messages back as they were sent.

    >>> stored = stored_message({"role": "assistant", "content": None, "refusal": None,
    ...                          "reasoning_content": "think"})
    >>> stored
    {'role': 'assistant', 'content': None, 'extra': '{"reasoning_content": "think"}'}
    >>> chat_messages([stored])
    [{'role': 'assistant', 'content': None, 'reasoning_content': 'think'}]

:func:`as_record` turns a record of any format (1 to :data:`FORMAT`) into this one's shape;
:func:`read_trajectories <rollout.synthesis.read_trajectories>` reads older records through it.

May import: the standard library; lazily, inside functions: pyarrow (the ``parquet`` extra).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "FORMAT",
    "JSON_FIELDS",
    "POLICY_KEYS",
    "TIMING_KEYS",
    "arrow_schema",
    "as_record",
    "chat_messages",
    "read_parquet",
    "stored_logprobs",
    "stored_message",
    "token_ids_of",
    "write_parquet",
]

FORMAT = 4
"""The record format's version (``format`` in every record). 1: before conversations; 2:
before ``truncated``; 3: messages and tools under the environment's tool names, ``tool_names``
an object, a turn's ``logprobs`` the choice's object, steps' ``arguments`` and ``structured``
as they came, no token ids."""

USAGE_KEYS = ("prompt_tokens", "completion_tokens", "total_tokens")
TIMING_KEYS = ("acquire", "setup", "policy", "reward")
POLICY_KEYS = (
    "name",
    "model",
    "base_url",
    "system_prompt",
    "temperature",
    "max_turns",
    "logprobs",
    "token_ids",
    "dialogue",
)
JSON_FIELDS = ("task", "reward_components", "tools")
"""The free-form fields (the task's, the reward's, the tools' JSON Schemas): objects in the
JSONL, JSON text in Parquet (decoded by :func:`read_parquet`)."""

RECORD_KEYS = (
    "episode_id",
    "task_id",
    "env",
    "outcome",
    "reason",
    "truncated",
    "reward",
    "answer",
    "steps",
    "attempts",
    "instance_id",
    "seconds",
    "task",
    "retried",
    "env_ref",
    "reward_components",
    "messages",
    "tools",
    "tool_names",
    "turns",
    "usage",
    "timings",
    "policy",
    "format",
)
"""Every field of a record, in order (an older record's missing ones read as null)."""

_MESSAGE_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name")
_OPTIONAL_MESSAGE_KEYS = ("tool_calls", "tool_call_id", "name", "extra")


# -- messages ----------------------------------------------------------------------------------
def _text_or_json(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _stored_call(call: Any) -> dict[str, Any]:
    call = call if isinstance(call, Mapping) else {}
    function = call.get("function") if isinstance(call.get("function"), Mapping) else {}
    arguments = function.get("arguments")
    return {
        "id": None if call.get("id") is None else str(call["id"]),
        "type": str(call.get("type") or "function"),
        "function": {
            "name": str(function.get("name", "")),
            "arguments": "" if arguments is None else _text_or_json(arguments),
        },
    }


def stored_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A chat message as a record stores it: ``role``, ``content`` (text or null), and, when the
    message has them, ``tool_calls`` (``id``, ``type``, ``function: {name, arguments}``, the
    arguments as JSON text), ``tool_call_id``, ``name``, and ``extra``: the JSON text of its
    other non-null fields (a ``content`` that is a list of parts goes there too)."""
    content = message.get("content")
    stored: dict[str, Any] = {"role": str(message.get("role", ""))}
    extra: dict[str, Any] = {}
    if content is None or isinstance(content, str):
        stored["content"] = content
    else:
        stored["content"] = None
        extra["content"] = content
    calls = message.get("tool_calls")
    if isinstance(calls, list) and calls:
        stored["tool_calls"] = [_stored_call(call) for call in calls]
    for key in ("tool_call_id", "name"):
        if message.get(key) is not None:
            stored[key] = str(message[key])
    for key, value in message.items():
        if key == "extra" and isinstance(value, str):  # a message stored already
            extra.update(json.loads(value))
        elif key not in _MESSAGE_KEYS and value is not None:
            extra[key] = value
    if extra:
        stored["extra"] = json.dumps(extra)
    return stored


def chat_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The record's ``messages`` as they were sent (ready for a chat template): the fields of
    ``extra`` back in place, absent fields left out."""
    out = []
    for stored in messages:
        message = {k: v for k, v in stored.items() if k != "extra" and v is not None}
        message["content"] = stored.get("content")
        if stored.get("extra"):
            message.update(json.loads(stored["extra"]))
        out.append(message)
    return out


def _sparse_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A message read from Parquet (every field present) as the JSONL holds it."""
    return {k: v for k, v in message.items() if k not in _OPTIONAL_MESSAGE_KEYS or v is not None}


# -- what a turn returned ----------------------------------------------------------------------
def _entry(item: Mapping[str, Any], *, top: bool) -> dict[str, Any]:
    raw = item.get("bytes")
    entry: dict[str, Any] = {
        "token": str(item.get("token", "")),
        "logprob": float(item["logprob"]) if isinstance(item.get("logprob"), int | float) else None,
        "bytes": [int(b) for b in raw] if isinstance(raw, list) else None,
    }
    if top:
        tops = item.get("top_logprobs")
        entry["top_logprobs"] = [_entry(t, top=False) for t in tops or [] if isinstance(t, Mapping)]
    return entry


def stored_logprobs(logprobs: Any) -> list[dict[str, Any]] | None:
    """A choice's ``logprobs`` as a record keeps them: OpenAI's ``content`` list, each token's
    ``token``, ``logprob``, ``bytes`` and ``top_logprobs`` (``[]`` when not asked for); the
    completions shape (``tokens`` and ``token_logprobs``, as some servers answer) read into the
    same; ``None`` when the reply had none. A list already in this shape is kept.

    >>> stored_logprobs({"content": [{"token": "hi", "logprob": -0.5}]})
    [{'token': 'hi', 'logprob': -0.5, 'bytes': None, 'top_logprobs': []}]
    """
    if isinstance(logprobs, list):
        items: Any = logprobs
    elif isinstance(logprobs, Mapping) and isinstance(logprobs.get("content"), list):
        items = logprobs["content"]
    elif isinstance(logprobs, Mapping) and isinstance(logprobs.get("tokens"), list):
        values = logprobs.get("token_logprobs") or []
        items = [
            {"token": token, "logprob": values[i] if i < len(values) else None}
            for i, token in enumerate(logprobs["tokens"])
        ]
    else:
        return None
    return [_entry(item, top=True) for item in items if isinstance(item, Mapping)]


def _ids(value: Any) -> list[int] | None:
    if isinstance(value, list) and all(
        isinstance(i, int) and not isinstance(i, bool) for i in value
    ):
        return list(value)
    return None


def token_ids_of(
    reply: Mapping[str, Any], choice: Mapping[str, Any]
) -> tuple[list[int] | None, list[int] | None]:
    """``(prompt_token_ids, token_ids)`` of a chat-completions reply asked with
    ``return_token_ids``: vLLM puts the prompt's ids on the reply and the completion's on the
    choice, SGLang both on the choice. ``None`` where the server sent none.

    >>> token_ids_of({"prompt_token_ids": [1, 2]}, {"token_ids": [3]})
    ([1, 2], [3])
    """
    prompt = _ids(choice.get("prompt_token_ids"))
    if prompt is None:
        prompt = _ids(reply.get("prompt_token_ids"))
    return prompt, _ids(choice.get("token_ids"))


# -- a whole record ----------------------------------------------------------------------------
def _usage(value: Any) -> dict[str, int | None] | None:
    if not isinstance(value, Mapping):
        return None
    return {
        key: value[key]
        if isinstance(value.get(key), int) and not isinstance(value.get(key), bool)
        else None
        for key in USAGE_KEYS
    }


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _turn(turn: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "message_index": int(turn.get("message_index", 0)),
        "started": _float(turn.get("started")),
        "seconds": _float(turn.get("seconds")),
        "usage": _usage(turn.get("usage")),
        "logprobs": stored_logprobs(turn.get("logprobs")),
        "finish_reason": turn.get("finish_reason"),
        "prompt_token_ids": _ids(turn.get("prompt_token_ids")),
        "token_ids": _ids(turn.get("token_ids")),
    }


def _step(step: Mapping[str, Any]) -> dict[str, Any]:
    if "arguments_json" in step:  # this format already
        arguments, structured = step.get("arguments_json"), step.get("structured_json")
    else:
        arguments = json.dumps(step.get("arguments") or {})
        raw = step.get("structured")
        structured = None if raw is None else json.dumps(raw)
    return {
        "tool": str(step.get("tool", "")),
        "arguments_json": arguments,
        "text": str(step.get("text", "")),
        "is_error": bool(step.get("is_error")),
        "started": _float(step.get("started")),
        "seconds": _float(step.get("seconds")),
        "structured_json": structured,
        "tool_call_id": step.get("tool_call_id"),
    }


def _renamed(message: dict[str, Any], names: Mapping[str, str]) -> dict[str, Any]:
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return message
    renamed = []
    for call in calls:
        function = dict(call.get("function") or {}) if isinstance(call, Mapping) else {}
        if function.get("name") in names:
            function["name"] = names[function["name"]]
        renamed.append({**call, "function": function} if isinstance(call, Mapping) else call)
    return {**message, "tool_calls": renamed}


def _upgraded_names(record: Mapping[str, Any]) -> dict[str, Any]:
    """A format-3 record's messages and tools under the names the model saw (its
    ``tool_names`` mapped the environment's names to them), ``tool_names`` as this format's."""
    offered = record.get("tool_names")
    if not isinstance(offered, Mapping):
        return {}
    names = {str(real): str(name) for real, name in offered.items()}
    tools = []
    for tool in record.get("tools") or []:
        function = dict(tool.get("function") or {})
        function["name"] = names.get(str(function.get("name")), function.get("name"))
        tools.append({**tool, "function": function})
    return {
        "messages": [_renamed(dict(m), names) for m in record.get("messages") or []],
        "tools": tools,
        "tool_names": [{"name": name, "tool": real} for real, name in names.items()],
    }


def as_record(record: Mapping[str, Any]) -> dict[str, Any]:
    """``record`` (a :class:`~rollout.trajectories.Trajectory` as a dict, or a record of any
    format) in this format's shape, its ``format`` kept: older records read with the fields
    they lack null (``truncated``, ``tool_names`` of format 1, ...), and a format-3 record's
    messages and tools back under the names the model saw."""
    record = dict(record)
    if isinstance(record.get("format"), int) and record["format"] < 4:
        record.update(_upgraded_names(record))
    messages = record.get("messages")
    policy: Mapping[str, Any] = (
        record["policy"] if isinstance(record.get("policy"), Mapping) else {}
    )
    timings: Mapping[str, Any] = (
        record["timings"] if isinstance(record.get("timings"), Mapping) else {}
    )
    return {
        **{key: record.get(key) for key in RECORD_KEYS},
        "retried": [str(r) for r in record.get("retried") or []],
        "messages": None if messages is None else [stored_message(m) for m in messages],
        "tool_names": [
            {"name": str(pair.get("name")), "tool": str(pair.get("tool"))}
            for pair in record.get("tool_names") or []
            if isinstance(pair, Mapping)
        ],
        "steps": [_step(s) for s in record.get("steps") or []],
        "turns": [_turn(t) for t in record.get("turns") or []],
        "usage": _usage(record.get("usage")),
        "timings": {key: _float(timings.get(key)) for key in TIMING_KEYS},
        "policy": {
            key: _float(policy.get(key)) if key == "temperature" else policy.get(key)
            for key in POLICY_KEYS
        },
    }


# -- Parquet -----------------------------------------------------------------------------------
_SCALARS: tuple[tuple[str, str], ...] = (
    ("episode_id", "string"),
    ("task_id", "string"),
    ("env", "string"),
    ("env_ref", "string"),
    ("instance_id", "string"),
    ("outcome", "string"),
    ("reason", "string"),
    ("truncated", "bool_"),
    ("reward", "float64"),
    ("answer", "string"),
    ("attempts", "int32"),
    ("seconds", "float64"),
    ("format", "int32"),
)


def arrow_schema() -> Any:
    """The ``pyarrow.Schema`` of ``trajectories.parquet``: the scalar fields typed, the nested
    ones lists of structs and structs, :data:`JSON_FIELDS` JSON text."""
    import pyarrow as pa

    text, number, count = pa.string(), pa.float64(), pa.int64()
    call = pa.struct(
        [
            ("id", text),
            ("type", text),
            ("function", pa.struct([("name", text), ("arguments", text)])),
        ]
    )
    message = pa.struct(
        [
            ("role", text),
            ("content", text),
            ("tool_calls", pa.list_(call)),
            ("tool_call_id", text),
            ("name", text),
            ("extra", text),
        ]
    )
    usage = pa.struct([(key, count) for key in USAGE_KEYS])
    token = [("token", text), ("logprob", number), ("bytes", pa.list_(count))]
    logprob = pa.struct([*token, ("top_logprobs", pa.list_(pa.struct(token)))])
    turn = pa.struct(
        [
            ("message_index", count),
            ("started", number),
            ("seconds", number),
            ("usage", usage),
            ("logprobs", pa.list_(logprob)),
            ("finish_reason", text),
            ("prompt_token_ids", pa.list_(count)),
            ("token_ids", pa.list_(count)),
        ]
    )
    step = pa.struct(
        [
            ("tool", text),
            ("arguments_json", text),
            ("text", text),
            ("is_error", pa.bool_()),
            ("started", number),
            ("seconds", number),
            ("structured_json", text),
            ("tool_call_id", text),
        ]
    )
    policy_types = {"temperature": number, "max_turns": count, "logprobs": pa.bool_()}
    policy = pa.struct(
        [
            (key, policy_types.get(key, pa.bool_() if key == "token_ids" else text))
            for key in POLICY_KEYS
        ]
    )
    return pa.schema(
        [(name, getattr(pa, kind)()) for name, kind in _SCALARS]
        + [(name, text) for name in JSON_FIELDS]
        + [
            ("retried", pa.list_(text)),
            ("messages", pa.list_(message)),
            ("tool_names", pa.list_(pa.struct([("name", text), ("tool", text)]))),
            ("steps", pa.list_(step)),
            ("turns", pa.list_(turn)),
            ("usage", usage),
            ("timings", pa.struct([(key, number) for key in TIMING_KEYS])),
            ("policy", policy),
        ]
    )


def write_parquet(rows: Sequence[Mapping[str, Any]], target: Path) -> None:
    """Write ``rows`` (records of any format) to ``target`` with :func:`arrow_schema`,
    through a scratch file renamed over it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = arrow_schema()
    records = [as_record(row) for row in rows]
    columns: dict[str, list[Any]] = {}
    for name in schema.names:
        if name in JSON_FIELDS:
            columns[name] = [
                None if r.get(name) is None else json.dumps(r.get(name)) for r in records
            ]
        else:
            columns[name] = [r.get(name) for r in records]
    table = pa.Table.from_pydict(columns, schema=schema)
    scratch = target.with_suffix(".parquet.tmp")
    pq.write_table(table, scratch)
    scratch.replace(target)


def read_parquet(path: Path) -> list[dict[str, Any]]:
    """The rows of a ``trajectories.parquet`` as the JSONL holds them (:data:`JSON_FIELDS`
    decoded, messages without their absent fields)."""
    import pyarrow.parquet as pq

    rows: list[dict[str, Any]] = pq.read_table(path).to_pylist()
    out = []
    for row in rows:
        for name, value in row.items():
            if name in JSON_FIELDS or (name in _WERE_TEXT and isinstance(value, str)):
                row[name] = None if value is None else json.loads(value)
        if isinstance(row.get("format"), int) and row["format"] < FORMAT:
            out.append(as_record(row))  # a file an older version wrote: JSON text columns
            continue
        if row.get("messages") is not None:
            row["messages"] = [_sparse_message(m) for m in row["messages"]]
        out.append(row)
    return out


_WERE_TEXT = ("steps", "retried", "messages", "tool_names", "turns", "usage", "timings", "policy")
"""The nested fields format 3's Parquet files held as JSON text."""
