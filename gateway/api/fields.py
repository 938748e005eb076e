"""The request-field policy of every API thinkgate serves, as data (sans-I/O, no work at import).

One table per endpoint (``TABLES``) names every top-level request field of its current official
reference, and what thinkgate does with it. Each field has exactly one policy:

- ``honoured``: the gateway or the engine does what the reference says, under the same name.
- ``mapped``: turned into the engine's nearest equivalent, which ``FieldRule.to`` names.
- ``ignored``: accepted and without effect on a self-hosted engine (billing, the provider's own
  caches, regions, abuse detection, ...); never sent to the engine.
- ``refused``: a 400 whose ``param`` names the field, only where dropping it would silently
  change the answer (audio out, web search, a prompt stored at OpenAI, ...). ``null`` and the
  values in ``FieldRule.inert`` ask for nothing: they are accepted, as if ``ignored``.

A field's sub-fields and values are told in its ``why`` (one line: the docs' table cell); a
field honoured or mapped as a whole may still have values the engine cannot serve. "Strict"
there means ``UNKNOWN_FIELDS=refuse``.

A field that no table names follows ``UNKNOWN_FIELDS``:

- ``ignore`` (the default): accepted, logged and counted by name, and named in the response's
  ``x-thinkgate-ignored`` header (comma-separated). Where the body goes on to the engine's API
  of the same name (chat, completions, embeddings) it is still forwarded, as vLLM's extras
  always were (vLLM ignores what it does not know, logging it at debug level); on the
  translated APIs (Responses, Messages) it is dropped.
- ``refuse``: a 400 naming it.

Where a row comes from (``FieldRule.source``): ``reference``, the API's current reference;
``legacy``, an earlier reference or vLLM version, still sent by clients; ``client``, a known
client's field beyond the reference (Codex CLI's ``client_metadata``); ``engine``, vLLM 0.32's
own request fields (``ChatCompletionRequest``, ``CompletionRequest``,
``EmbeddingCompletionRequest``), which self-hosted clients use; ``gateway``, thinkgate's own
directives. The references were read from the SDKs generated from them, openai-python 3.57.0
(``types/chat/completion_create_params.py``, ``types/responses/response_create_params.py``,
``types/completion_create_params.py``, ``types/embedding_create_params.py``) and
anthropic-sdk-python 2.15.0 (``types/message_create_params.py``, ``message_count_tokens_params.py``
and their ``beta`` twins); older SDKs (3.3.1, 0.121.0) add only Messages' ``temperature``,
``top_p``, ``top_k`` and beta ``output_format``, kept as ``legacy``. What the SDKs send as headers
(``betas`` as ``anthropic-beta``, ``user_profile_id``, ``workspace_id``) has no row.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal, TypeAlias

Policy = Literal["honoured", "mapped", "ignored", "refused"]
Source = Literal["reference", "legacy", "client", "engine", "gateway"]
UnknownFields = Literal["ignore", "refuse"]  # the UNKNOWN_FIELDS setting
Json: TypeAlias = bool | int | float | str | list["Json"] | dict[str, "Json"] | None

IGNORED_HEADER = "x-thinkgate-ignored"


@dataclass(frozen=True, slots=True)
class FieldRule:
    """What thinkgate does with one request field."""

    policy: Policy
    why: str  # one line, shown in the docs' table
    to: str = ""  # mapped: the engine field(s) it becomes
    source: Source = "reference"
    inert: tuple[Json, ...] = ()  # refused: values besides null that ask for nothing

    def __post_init__(self) -> None:
        if (self.policy == "mapped") != bool(self.to):
            raise ValueError("a mapped field names what it becomes, and only a mapped one")
        if self.inert and self.policy != "refused":
            raise ValueError("only a refused field has inert values")


def _honour(why: str, source: Source = "reference") -> FieldRule:
    return FieldRule("honoured", why, source=source)


def _map(to: str, why: str, source: Source = "reference") -> FieldRule:
    return FieldRule("mapped", why, to=to, source=source)


def _ignore(why: str, source: Source = "reference") -> FieldRule:
    return FieldRule("ignored", why, source=source)


def _refuse(why: str, *inert: Json, source: Source = "reference") -> FieldRule:
    return FieldRule("refused", why, source=source, inert=inert)


# -- shared rows -----------------------------------------------------------------------------

_SAMPLER = "the engine's sampler"
_IGNORED_BY_VLLM = "an end-user id for the provider's abuse detection; vLLM ignores it too"
_NO_CACHE_KEY = "the provider's prompt cache; vLLM caches prefixes by itself, with no key or TTL"
_MODERATION = _refuse(
    "no moderation model runs here: a dropped `block` policy would let through what it should "
    "stop (a deployment's guardrails are GUARDRAILS_FILE)"
)

# vLLM 0.32's sampling and engine fields of both chat and completions (its protocol models)
_VLLM_COMMON: Mapping[str, FieldRule] = MappingProxyType(
    {
        "thinking_token_budget": _map(
            "thinking_token_budget",
            "the request's reasoning budget, the smaller with the effort's and the key's ceiling; "
            "kept by the engine or the gateway (gateway.relay.effort)",
            "engine",
        ),
        "use_beam_search": _honour(
            "vLLM's beam search (not streamed: the engine refuses that)", "engine"
        ),
        "top_k": _honour(_SAMPLER, "engine"),
        "min_p": _honour(_SAMPLER, "engine"),
        "repetition_penalty": _honour(_SAMPLER, "engine"),
        "length_penalty": _honour("vLLM's beam search", "engine"),
        "watermarking": _honour("vLLM's output watermark", "engine"),
        "stop_token_ids": _honour("the engine stops at these token ids", "engine"),
        "include_stop_str_in_output": _honour("the engine keeps the stop string", "engine"),
        "ignore_eos": _honour("the engine generates past end-of-sequence", "engine"),
        "min_tokens": _honour("the engine generates at least this many tokens", "engine"),
        "skip_special_tokens": _honour("the engine's detokenizer", "engine"),
        "spaces_between_special_tokens": _honour("the engine's detokenizer", "engine"),
        "truncate_prompt_tokens": _honour(
            "the engine keeps only the prompt's last N tokens", "engine"
        ),
        "truncation_side": _honour("which end truncate_prompt_tokens keeps", "engine"),
        "prompt_logprobs": _honour("the prompt's logprobs (the client's own text)", "engine"),
        "logprob_token_ids": _honour(
            "logprobs of these ids; withheld from a hidden key where reasoning is, as logprobs",
            "engine",
        ),
        "allowed_token_ids": _honour(_SAMPLER, "engine"),
        "bad_words": _honour(_SAMPLER, "engine"),
        "add_special_tokens": _honour("the engine's tokenizer", "engine"),
        "structured_outputs": _honour(
            "the engine's structured outputs (json, regex, choice, ...)", "engine"
        ),
        "request_id": _honour("the engine's id for the request (its logs)", "engine"),
        "session_id": _honour("the engine's session affinity", "engine"),
        "return_tokens_as_token_ids": _honour("how logprobs spell tokens", "engine"),
        "return_token_ids": _honour(
            "the output's token ids; withheld from a hidden key wherever reasoning is, as logprobs "
            "are (they decode to it with the model's public tokenizer)",
            "engine",
        ),
        "routed_experts_prompt_start": _honour("vLLM's routed-experts data", "engine"),
        "cache_salt": _honour("isolates the request's prefix-cache entries", "engine"),
        "vllm_xargs": _honour("arguments for the engine's extensions", "engine"),
        "repetition_detection": _honour("the engine stops a repeating output early", "engine"),
        "stream_interval": _honour(
            "tokens per streamed chunk, at least the engine's setting", "engine"
        ),
        "priority": _ignore(
            "the engine's queue order: a client's would pass other tenants; the gateway's own "
            "priority (x-thinkgate-priority, capped per key) decides",
            "engine",
        ),
        "kv_transfer_params": _ignore(
            "set between engines in disaggregated serving: from a client it would point the engine "
            "at KV blocks it did not compute",
            "engine",
        ),
        "ec_transfer_params": _ignore(
            "set between engines in disaggregated serving (as kv_transfer_params)", "engine"
        ),
        "return_token_offsets": _ignore("for vLLM's render endpoints only", "engine"),
        "mm_payload": _ignore("for vLLM's render endpoints only", "engine"),
        "return_mm_kwargs": _ignore("for vLLM's render endpoints only", "engine"),
        # removed from vLLM, which now drops them with a warning
        "guided_json": _refuse(
            "removed from vLLM, which drops it: the output would not be "
            "constrained; send response_format or structured_outputs",
            source="legacy",
        ),
        "guided_regex": _refuse(
            "removed from vLLM, which drops it: send structured_outputs.regex", source="legacy"
        ),
        "guided_choice": _refuse(
            "removed from vLLM, which drops it: send structured_outputs.choice", source="legacy"
        ),
        "guided_grammar": _refuse(
            "removed from vLLM, which drops it: send structured_outputs.grammar", source="legacy"
        ),
        "guided_decoding_backend": _ignore(
            "removed from vLLM; the backend is the engine's", "legacy"
        ),
        "guided_whitespace_pattern": _ignore(
            "removed from vLLM; nothing without guided_json", "legacy"
        ),
    }
)

_INCLUDE_REASONING = _map(
    "the key's reasoning visibility",
    "false lowers the request's own reasoning visibility, never raises it; not sent on",
    "gateway",
)

# -- POST /v1/chat/completions ---------------------------------------------------------------

CHAT: Mapping[str, FieldRule] = MappingProxyType(
    {
        "messages": _honour(
            "sent as given; an earlier turn's reasoning renamed or dropped per the "
            "model's history rule"
        ),
        "model": _honour("routes to the upstreams that serve it (GET /v1/models)"),
        "audio": _refuse(
            "audio output: the engines here write text, and vLLM would drop it silently"
        ),
        "frequency_penalty": _honour(_SAMPLER),
        "function_call": _refuse(
            "deprecated for tool_choice; vLLM drops it silently, so a forced call would be lost",
            "none",
            "auto",
        ),
        "functions": _refuse(
            "deprecated for tools; vLLM drops it silently and the model would answer without them",
            [],
        ),
        "logit_bias": _honour("the engine's sampler; token ids of the served model's tokenizer"),
        "logprobs": _honour(
            "the engine's; withheld from a hidden key for chunks that carried reasoning"
        ),
        "max_completion_tokens": _honour(
            "the engine's output limit, reasoning included; clamped to the room the prompt leaves"
        ),
        "max_tokens": _honour("deprecated alias of max_completion_tokens: the same limit"),
        "metadata": _ignore("tags for OpenAI's stored completions, which are not kept here"),
        "modalities": _refuse(
            'only ["text"] is served; "audio" would be dropped silently', ["text"]
        ),
        "moderation": _MODERATION,
        "n": _honour("the engine samples n choices (at most 16)"),
        "parallel_tool_calls": _honour("false: the engine keeps the first call only"),
        "prediction": _ignore(
            "Predicted Outputs only speed up a known answer; the model's answer is the same without"
        ),
        "presence_penalty": _honour(_SAMPLER),
        "prompt_cache_key": _ignore(_NO_CACHE_KEY),
        "prompt_cache_options": _ignore(_NO_CACHE_KEY),
        "prompt_cache_retention": _ignore(_NO_CACHE_KEY),
        "reasoning_effort": _map(
            "thinking_token_budget and the format's thinking switch",
            "the reasoning budget of gateway.relay.effort; none switches thinking off where the "
            "format can; sent on for templates that read it",
        ),
        "response_format": _honour(
            "the engine's structured outputs: text, json_object, json_schema"
        ),
        "safety_identifier": _ignore("for OpenAI's abuse detection"),
        "seed": _honour("the engine's sampler (best effort, as the reference says)"),
        "service_tier": _ignore("one tier here; the gateway's priority is x-thinkgate-priority"),
        "stop": _honour(
            "the engine stops; a stop string cut across reasoning and answer is repaired"
        ),
        "store": _ignore("OpenAI's stored completions; the ledger records every request anyway"),
        "stream": _honour("Server-sent events, as the reference"),
        "stream_options": _honour(
            "include_usage as asked (the engine is always asked for usage); "
            "include_obfuscation: no obfuscation is sent"
        ),
        "temperature": _honour(_SAMPLER),
        "tool_choice": _honour(
            "none, auto, required, a function; allowed_tools: only those tools; custom: its own"
        ),
        "tools": _honour(
            "function tools, through the engine's tool parser; custom tools as "
            "functions with one string input, as on Responses"
        ),
        "top_logprobs": _honour("the engine's; withheld with logprobs where reasoning is"),
        "top_p": _honour(_SAMPLER),
        "user": _ignore(_IGNORED_BY_VLLM),
        "verbosity": _ignore("a style hint with no engine equivalent"),
        "web_search_options": _refuse(
            "web search: nothing here searches, and the answer would silently lack it"
        ),
        # thinkgate's own
        "include_reasoning": _INCLUDE_REASONING,
        "reasoning": _map(
            "the key's reasoning visibility; reasoning_effort; thinking_token_budget",
            "OpenRouter's object: exclude as include_reasoning false; effort as reasoning_effort; "
            "max_tokens as thinking_token_budget; not sent on",
            "gateway",
        ),
        # vLLM's own
        **_VLLM_COMMON,
        "echo": _honour(
            "vLLM repeats the final assistant message first; refused for a model "
            "whose output is split (it would be read as output)",
            "engine",
        ),
        "add_generation_prompt": _honour(
            "the template's; the splitter starts where the prompt leaves the reasoning", "engine"
        ),
        "continue_final_message": _honour(
            "assistant prefill; the splitter starts where the prefill leaves the reasoning",
            "engine",
        ),
        "documents": _honour("for templates that take documents (RAG)", "engine"),
        "chat_template": _honour(
            "vLLM refuses it unless run with --trust-request-chat-template", "engine"
        ),
        "chat_template_kwargs": _honour(
            "the template's; the gateway sets the format's thinking "
            "switch off when it decided thinking is off",
            "engine",
        ),
        "media_io_kwargs": _honour("the engine's media loaders", "engine"),
        "mm_processor_kwargs": _honour("the engine's multimodal processor", "engine"),
        "return_prompt_text": _honour("the prompt as templated: the client's own text", "engine"),
    }
)

# -- POST /v1/responses ----------------------------------------------------------------------

_BUILT_IN_TOOLS = (
    "web_search, file_search, code_interpreter, image_generation, computer_use, tool_search, "
    "programmatic_tool_calling: dropped, named in x-thinkgate-dropped-tools, refused when "
    "strict; mcp, shell, local_shell, apply_patch refused"
)

# vLLM's Responses request has these too (vllm.entrypoints.openai.responses.protocol)
RESPONSES_ENGINE_FIELDS = (
    "ignore_eos", "repetition_penalty", "stop_token_ids", "vllm_xargs", "cache_salt",
)  # fmt: skip

RESPONSES: Mapping[str, FieldRule] = MappingProxyType(
    {
        "access_programs": _ignore("OpenAI's Cyber access programs"),
        "background": _honour("runs detached; read back by GET /v1/responses/{id} (DESIGN §9)"),
        "background_options": _ignore(
            "OpenAI's discounted completion windows and their scheduling hint"
        ),
        "context_management": _ignore(
            "compaction past a threshold: an input too long for the "
            "engine is refused by it, never cut silently"
        ),
        "conversation": _honour(
            "the stored conversation's items come first and the turn is "
            "added to it (/v1/conversations, DESIGN §9)"
        ),
        "image": _ignore("image context compression: the engines here read text"),
        "include": _honour(
            "reasoning.encrypted_content: sealed reasoning; message.output_text.logprobs: the "
            "engine's; built-in tools' outputs: none, those tools do not run"
        ),
        "input": _map(
            "chat messages",
            "items as chat messages (gateway.api.items); "
            "item_reference from this tenant's stored responses",
        ),
        "instructions": _map(
            "a leading system message",
            "not carried over from previous_response_id, as the reference says",
        ),
        "max_output_tokens": _map(
            "max_tokens",
            "the output limit, reasoning included; clamped to the room the prompt leaves",
        ),
        "max_tool_calls": _ignore("bounds calls to built-in tools, which do not run here"),
        "metadata": _honour("kept on the response object and echoed; not sent to the engine"),
        "model": _honour("routes to the upstreams that serve it (GET /v1/models)"),
        "moderation": _MODERATION,
        "parallel_tool_calls": _honour("false: the engine keeps the first call only"),
        "previous_response_id": _honour(
            "this tenant's stored conversation of that response comes first"
        ),
        "prompt": _refuse(
            "a prompt template stored at OpenAI: none is stored here, and the "
            "request would run without its instructions"
        ),
        "prompt_cache_key": _ignore(_NO_CACHE_KEY),
        "prompt_cache_options": _ignore(_NO_CACHE_KEY),
        "prompt_cache_retention": _ignore(_NO_CACHE_KEY),
        "reasoning": _map(
            "reasoning_effort; summary_text parts; the history's reasoning turns",
            "effort: the budget; summary (generate_summary): one summary_text part, the model's "
            "whole trace, for a key that may see reasoning; context: turns that keep it; mode "
            "ignored",
        ),
        "safety_identifier": _ignore("for OpenAI's abuse detection"),
        "service_tier": _ignore("one tier here; the gateway's priority is x-thinkgate-priority"),
        "store": _honour("kept for previous_response_id, GET and input_items (default true)"),
        "stream": _honour("the reference's events and item shapes"),
        "stream_options": _ignore("include_obfuscation: no obfuscation field is sent"),
        "temperature": _honour(_SAMPLER),
        "text": _map(
            "response_format",
            "format text, json_object, json_schema: the engine's "
            "structured outputs; verbosity: ignored",
        ),
        "tool_choice": _map(
            "tool_choice",
            "none, auto, required, a function or custom tool; allowed_tools: only those tools, its "
            "mode; a built-in tool: refused",
        ),
        "tools": _map(
            "function tools",
            "function; namespace flattened and mapped back; custom: one string input; "
            + _BUILT_IN_TOOLS,
        ),
        "top_logprobs": _map(
            "logprobs, top_logprobs",
            "the engine's, in output_text.logprobs; withheld where reasoning is, for a hidden key",
        ),
        "top_p": _honour(_SAMPLER),
        "truncation": _honour(
            "auto: the oldest turns dropped to fit the engine's context, said in "
            "x-thinkgate-truncated; disabled (the default): nothing is cut, an input too long "
            "is the engine's to refuse"
        ),
        "user": _ignore("echoed; " + _IGNORED_BY_VLLM),
        # beyond the reference
        "client_metadata": _ignore(
            "Codex CLI's string map (W3C traceparent, tracestate, ...)", "client"
        ),
        "n": _refuse(
            "one output per response: a client asking for several answers must not get "
            "one (chat has n)",
            1,
            source="client",
        ),
        # vLLM's own Responses fields that act on the engine's sampling: passed on in the chat
        # request the Responses request becomes (gateway.api.responses)
        **{name: _VLLM_COMMON[name] for name in RESPONSES_ENGINE_FIELDS},
        "seed": _honour("the engine's sampler (best effort)", "engine"),
        "priority": _VLLM_COMMON["priority"],
        "kv_transfer_params": _VLLM_COMMON["kv_transfer_params"],
    }
)

# -- POST /v1/messages -----------------------------------------------------------------------

_CLIENT_TOOLS = (
    "client tools (custom, input_schema) as functions; Anthropic-run server tools dropped, named "
    "in x-thinkgate-dropped-tools, refused when strict; system messages' tool changes applied"
)
_MCP_SERVERS = _refuse(
    "remote MCP servers Anthropic would call: nothing here calls them, and "
    "the model would answer without their tools",
    [],
)
_VLLM_IN_MESSAGES = "vLLM's own field, passed through as on chat"

MESSAGES: Mapping[str, FieldRule] = MappingProxyType(
    {
        "max_tokens": _honour(
            "the output limit, thinking included; clamped to the room the prompt leaves"
        ),
        "messages": _map(
            "chat messages",
            "blocks as chat messages, tool calls and results; "
            "thinking opened from its signature; role system folded in order",
        ),
        "model": _honour("routes to the upstreams that serve it (GET /v1/models)"),
        "cache_control": _ignore("automatic prompt caching; vLLM caches prefixes by itself"),
        "container": _ignore("the sandbox of Anthropic-run tools; none run here (see tools)"),
        "diagnostics": _ignore("asks Anthropic to explain prompt-cache misses"),
        "inference_geo": _ignore("the deployment decides where inference runs"),
        "metadata": _ignore("user_id: for Anthropic's abuse detection; vLLM ignores it too"),
        "output_config": _map(
            "reasoning_effort; response_format",
            "effort: the reasoning budget, as thinking's; format: the engine's structured outputs; "
            "task_budget ignored",
        ),
        "service_tier": _ignore("one tier here; the gateway's priority is x-thinkgate-priority"),
        "speed": _ignore("Anthropic's fast mode: the answer is the same model's"),
        "stop_sequences": _map(
            "stop",
            "a stop string cut across reasoning and answer is repaired; stop_reason stop_sequence",
        ),
        "stream": _honour("the reference's events"),
        "system": _map(
            "a leading system message",
            "text blocks joined, their cache_control ignored; role system messages follow it",
        ),
        "thinking": _map(
            "thinking_token_budget; reasoning_effort",
            "enabled: budget_tokens; disabled: effort none; adaptive, between_tools: as the format "
            "thinks; display omitted: blocks without text",
        ),
        "tool_choice": _map(
            "tool_choice, parallel_tool_calls",
            "auto, any (required), tool (a function), none; disable_parallel_tool_use",
        ),
        "tools": _map("function tools", _CLIENT_TOOLS),
        # beta (anthropic-beta header)
        "billing_policy": _ignore("who Anthropic bills"),
        "compaction": _refuse(
            "a compaction request answers with only a summary block; answering "
            "the conversation instead would be another answer"
        ),
        "context_management": _map(
            "the history sent",
            "clear_thinking_*, clear_tool_uses_* applied to the history and reported as Anthropic "
            "does; compact_*: no effect",
        ),
        "fallback_credit_token": _ignore("Anthropic's billing of a retried refusal"),
        "fallbacks": _ignore(
            "retries on other models after a policy refusal; engines here do not refuse so"
        ),
        "mcp_servers": _MCP_SERVERS,
        "thread": _refuse(
            "history Anthropic holds: continuing a thread here would lose it, and "
            "none is held for Messages"
        ),
        # earlier references (anthropic-sdk-python 0.x/1.x), still sent by clients
        "temperature": _honour(_SAMPLER, "legacy"),
        "top_p": _honour(_SAMPLER, "legacy"),
        "top_k": _honour(_SAMPLER, "legacy"),
        "output_format": _map(
            "response_format", "structured outputs' first form, now output_config.format", "legacy"
        ),
        # vLLM's own
        "seed": _honour(_VLLM_IN_MESSAGES, "engine"),
        "min_p": _honour(_VLLM_IN_MESSAGES, "engine"),
        "repetition_penalty": _honour(_VLLM_IN_MESSAGES, "engine"),
        "logit_bias": _honour(_VLLM_IN_MESSAGES, "engine"),
        "structured_outputs": _honour(_VLLM_IN_MESSAGES, "engine"),
        "chat_template_kwargs": _honour(_VLLM_IN_MESSAGES, "engine"),
    }
)

# -- POST /v1/messages/count_tokens ----------------------------------------------------------

_NOT_COUNTED = "no bearing on the input count here"

_COUNTED: Mapping[str, FieldRule] = MappingProxyType(
    {
        "messages": _map(
            "the prompt counted",
            "as on Messages, rendered by the model's template (vLLM's /tokenize)",
        ),
        "model": _honour("the engine that serves it counts"),
        "cache_control": _ignore(_NOT_COUNTED),
        "output_config": _ignore(_NOT_COUNTED),
        "speed": _ignore(_NOT_COUNTED),
        "system": _map("the prompt counted", "as on Messages"),
        "thinking": _ignore("counted as the template renders the prompt by default"),
        "tool_choice": _ignore(_NOT_COUNTED),
        "tools": _map(
            "the prompt counted", "client tools as on Messages; server tools dropped, not counted"
        ),
        # beta
        "billing_policy": _ignore(_NOT_COUNTED),
        "compaction": _ignore("accepted and ignored, as the reference says for count_tokens"),
        "context_management": _map(
            "the prompt counted", "the edits applied to the history before it is counted"
        ),
        "mcp_servers": _MCP_SERVERS,
    }
)

# every other Messages field, which a client may send along to count_tokens
COUNT_TOKENS: Mapping[str, FieldRule] = MappingProxyType(
    {**_COUNTED, **{n: _ignore(_NOT_COUNTED, "client") for n in MESSAGES if n not in _COUNTED}}
)

# -- POST /v1/completions --------------------------------------------------------------------

COMPLETIONS: Mapping[str, FieldRule] = MappingProxyType(
    {
        "model": _honour("routes to the upstreams that serve it (GET /v1/models)"),
        "prompt": _honour(
            "the engine's /v1/completions: the model's whole input, no template; token ids too"
        ),
        "best_of": _refuse(
            "vLLM 0.32 drops it silently: n samples, not the best n of best_of; "
            "accepted equal to n",
            1,
        ),
        "echo": _honour(
            "refused for a model whose output is split: the echoed prompt would be read as output"
        ),
        "frequency_penalty": _honour(_SAMPLER),
        "logit_bias": _honour("the engine's sampler; token ids of the served model's tokenizer"),
        "logprobs": _honour(
            "the engine's top-N per token; withheld from a hidden key where the text held reasoning"
        ),
        "max_tokens": _honour(
            "the output limit (default 16); clamped to the room the prompt leaves"
        ),
        "n": _honour("the engine samples n choices (at most 16)"),
        "presence_penalty": _honour(_SAMPLER),
        "seed": _honour("the engine's sampler (best effort, as the reference says)"),
        "stop": _honour("the engine stops"),
        "stream": _honour("Server-sent events, as the reference"),
        "stream_options": _honour("include_usage as asked (the engine is always asked for usage)"),
        "suffix": _honour(
            "fill-in-the-middle where vLLM renders FIM; the engine refuses it otherwise"
        ),
        "temperature": _honour(_SAMPLER),
        "top_p": _honour(_SAMPLER),
        "user": _ignore(_IGNORED_BY_VLLM),
        # thinkgate's own
        "include_reasoning": _INCLUDE_REASONING,
        # vLLM's own
        **_VLLM_COMMON,
        "response_format": _honour(
            "the engine's structured outputs (vLLM takes it here too)", "engine"
        ),
        "prompt_embeds": _honour(
            "vLLM refuses it unless run with --enable-prompt-embeds", "engine"
        ),
    }
)

# -- POST /v1/embeddings ---------------------------------------------------------------------

EMBEDDINGS: Mapping[str, FieldRule] = MappingProxyType(
    {
        "input": _honour("texts or token ids, passed through"),
        "model": _honour("routes to the upstreams that serve it (GET /v1/models)"),
        "dimensions": _honour("Matryoshka models; the engine refuses it for others"),
        "encoding_format": _honour("float or base64"),
        "user": _ignore(_IGNORED_BY_VLLM),
        # vLLM's own
        "add_special_tokens": _honour("the engine's tokenizer", "engine"),
        "padding": _honour("the engine's tokenizer", "engine"),
        "embed_dtype": _honour("the engine's base64 encoding", "engine"),
        "endianness": _honour("the engine's base64 encoding", "engine"),
        "use_activation": _honour("the engine's pooler", "engine"),
        "truncate_prompt_tokens": _honour(
            "the engine keeps only the input's last N tokens", "engine"
        ),
        "truncation_side": _honour("which end truncate_prompt_tokens keeps", "engine"),
        "request_id": _honour("the engine's id for the request (its logs)", "engine"),
        "mm_processor_kwargs": _honour("the engine's multimodal processor", "engine"),
        "cache_salt": _honour("isolates the request's prefix-cache entries", "engine"),
        "priority": _VLLM_COMMON["priority"],
    }
)

TABLES: Mapping[str, Mapping[str, FieldRule]] = MappingProxyType(
    {
        "/v1/chat/completions": CHAT,
        "/v1/responses": RESPONSES,
        "/v1/messages": MESSAGES,
        "/v1/messages/count_tokens": COUNT_TOKENS,
        "/v1/completions": COMPLETIONS,
        "/v1/embeddings": EMBEDDINGS,
    }
)


def markdown_table(api: Mapping[str, FieldRule]) -> str:
    """The docs' table of one API: a row per field, in the table's order."""
    lines = ["| field | from | policy | what thinkgate does |", "|---|---|---|---|"]
    for name, rule in api.items():
        lines.append(f"| `{name}` | {rule.source} | {_policy_cell(rule)} | {_cell(rule.why)} |")
    return "\n".join(lines) + "\n"


def _policy_cell(rule: FieldRule) -> str:
    if rule.policy == "mapped":
        return f"mapped → {_cell(rule.to)}"
    if rule.policy == "refused" and rule.inert:
        accepted = ", ".join(f"`{_cell(json.dumps(v))}`" for v in rule.inert)
        return f"refused (null, {accepted} accepted)"
    return rule.policy


def _cell(text: str) -> str:
    """Text safe inside a table cell: a pipe would end the cell."""
    return text.replace("|", "\\|")
