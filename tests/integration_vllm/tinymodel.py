"""Build a tiny DeepSeek-R1-shaped model for the real-vLLM suite, offline, in seconds.

Run with the vLLM virtual environment's Python (it has torch, transformers and tokenizers):
``python tinymodel.py OUT_DIR``. Nothing is downloaded: the tokenizer is trained here on
generated text and the weights are random.

- Tokenizer: byte-level BPE (so any text can be spelled), with ``<think>`` and ``</think>`` as
  *non-special* added tokens, as in DeepSeek-R1 (vLLM's ``deepseek_r1`` reasoning parser finds
  them in the vocabulary), and DeepSeek's special tokens for the chat template.
- Chat template: DeepSeek-R1's shape; the generation prompt ends with ``<think>\\n``, so the
  output starts inside the think block. Like DeepSeek-V3.1's hybrid template, the request's
  ``chat_template_kwargs: {"thinking": false}`` closes the block in the prompt instead
  (``</think>``): the model answers without thinking.
- Model: a random-weight Qwen2 (2 layers, hidden 128, 4 heads, 2 KV heads: vLLM's CPU attention
  needs a head size of at least 32), ``vocab_size`` exactly the tokenizer's size.

Random weights produce noise; tests make the output deterministic with ``structured_outputs``
(a literal regex), and choose how tags are tokenised with ``logit_bias`` on the tag token ids
(``tokens.json`` beside the model records them).
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
USER, ASSISTANT = "<｜User｜>", "<｜Assistant｜>"
THINK, END_THINK = "<think>", "</think>"

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] }}"
    "{% elif message['role'] == 'user' %}" + USER + "{{ message['content'] }}"
    "{% elif message['role'] == 'assistant' %}"
    + ASSISTANT
    + "{{ message['content'] }}"
    + EOS
    + "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}"
    + ASSISTANT
    + "{% if thinking is defined and not thinking %}"
    + END_THINK
    + "{% else %}"
    + THINK
    + "\n{% endif %}{% endif %}"
)


def corpus(rng: random.Random, lines: int = 4000) -> list[str]:
    words = [
        "the",
        "user",
        "asks",
        "for",
        "times",
        "that",
        "is",
        "answer",
        "so",
        "let",
        "me",
        "think",
        "wait",
        "first",
        "then",
        "check",
        "number",
        "blue",
        "sky",
        "light",
        "scatter",
        "short",
        "long",
        "waves",
        "because",
        "result",
        "okay",
        "hence",
    ]
    out = []
    for _ in range(lines):
        a, b = rng.randint(1, 12), rng.randint(1, 12)
        out.append(
            f"The user asks for {a} times {b}. That is {a * b}.\n{END_THINK}\n\n"
            f"The answer is {a * b}."
        )
        out.append(" ".join(rng.choice(words) for _ in range(rng.randint(4, 14))) + ".")
    return out


def build_tokenizer(out: Path):  # type: ignore[no-untyped-def]
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=[BOS, EOS, USER, ASSISTANT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus(random.Random(0)), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in (THINK, END_THINK)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=EOS, model_max_length=512
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return fast


def build_model(out: Path, vocab_size: int, bos_id: int, eos_id: int) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        torch_dtype="float32",
    )
    Qwen2ForCausalLM(config).save_pretrained(out, safe_serialization=True)


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out)
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in (THINK, END_THINK, BOS, EOS)}
    build_model(out, len(tokenizer), ids[BOS], ids[EOS])
    (out / "tokens.json").write_text(json.dumps(ids))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
