"""Chat templates (jaxnet.tokenizers.chat) against transformers' apply_chat_template: the same ids,
the same assistant mask (return_assistant_tokens_mask), for a ChatML and a Llama 3-style template,
with system turns, several turns and non-ASCII text; the mask derived from prefixes for a template
without {% generation %} blocks equal to the marked template's; templates found where transformers
finds them (chat_template.jinja, tokenizer_config.json's string or list).

The tokenizers are trained here with the tokenizers library on a few KB of local text and saved by
transformers' PreTrainedTokenizerFast with a template attached, offline."""

from __future__ import annotations

import json

import numpy as np
import pytest
from chat_corpora import CHATML, CHATML_PLAIN, CHATML_SPECIAL, bpe

from jaxnet import tokenizers
from jaxnet.errors import UserError
from jaxnet.tokenizers import chat

transformers = pytest.importorskip("transformers", reason="the reference extra (transformers) is not installed")

LLAMA_SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]

# Llama 3's own template (as its checkpoints ship it), and the same with the assistant's text marked.
LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
LLAMA3_MARKED = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] | trim + '<|eot_id|>' }}"
    "{% endgeneration %}{% else %}{{ message['content'] | trim + '<|eot_id|>' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
# What the environment offers templates: namespace, loop controls, tojson, raise_exception, lstrip/trim.
FEATURES = """{%- set ns = namespace(system='You are terse.') %}
{%- for message in messages %}
    {%- if message.role == 'system' %}{% set ns.system = message.content %}{% continue %}{% endif %}
    {%- if message.role not in ['user', 'assistant'] %}{{ raise_exception('unknown role ' + message.role) }}{% endif %}
    <{{ message.role }} meta={{ {'n': loop.index, 'text': message.content[:4]} | tojson }}>
    {{ message.content }}
{% endfor %}
[{{ ns.system }}]{% if add_generation_prompt %}<assistant>{% endif %}"""

CONVERSATIONS = [
    [{"role": "user", "content": "Hello, how are you?"}, {"role": "assistant", "content": "I am fine, thank you."}],
    [
        {"role": "system", "content": "You answer about the weather."},
        {"role": "user", "content": "What is the weather like today?"},
        {"role": "assistant", "content": "It is sunny and warm."},
        {"role": "user", "content": "And tomorrow, in München?"},
        {"role": "assistant", "content": "  Grüße: rain, 12 °C 🙂 "},
    ],
    [
        {"role": "user", "content": "東京 と 北京?"},
        {"role": "assistant", "content": "北京 ist weit."},
        {"role": "user", "content": "Whether 'tis nobler"},
    ],
    [{"role": "system", "content": "Only a system turn and a question."}, {"role": "user", "content": "Why?"}],
]


def save(directory, special: list[str], template: str | None, **tokens) -> None:
    """A checkpoint's tokenizer files as transformers writes them (chat_template.jinja for a template)."""
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe(special), chat_template=template, **tokens)
    fast.save_pretrained(directory)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """Checkpoint directories by name: chatml and llama3 (with and without generation blocks)."""
    root = tmp_path_factory.mktemp("chat")
    made = {}
    for name, special, template, tokens in (
        ("chatml", CHATML_SPECIAL, CHATML, {"eos_token": "<|im_end|>"}),
        ("chatml_plain", CHATML_SPECIAL, CHATML_PLAIN, {"eos_token": "<|im_end|>"}),
        ("llama3", LLAMA_SPECIAL, LLAMA3_MARKED, {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}),
        ("llama3_plain", LLAMA_SPECIAL, LLAMA3, {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}),
        ("features", CHATML_SPECIAL, FEATURES, {"eos_token": "<|im_end|>"}),
    ):  # fmt: skip
        made[name] = root / name
        save(made[name], special, template, **tokens)
    return made


def reference(directory, messages, **kw):
    tok = transformers.AutoTokenizer.from_pretrained(str(directory))
    return tok.apply_chat_template(messages, return_dict=True, return_assistant_tokens_mask=True, **kw)


def ours(directory, messages):
    return chat.load(directory).encode(messages, tokenizers.get(f"hf:{directory}"))


@pytest.mark.parametrize("name", ["chatml", "llama3"])
def test_ids_and_assistant_mask_equal_transformers(dirs, name):
    template = chat.load(dirs[name])
    assert template.marked and template.source == (CHATML if name == "chatml" else LLAMA3_MARKED)
    for messages in CONVERSATIONS:
        want = reference(dirs[name], messages)
        ids, mask = ours(dirs[name], messages)
        assert ids.tolist() == want["input_ids"]
        assert mask.tolist() == want["assistant_masks"]
    # the assistant's tokens are the replies and the end-of-turn token, decoded back
    ids, mask = ours(dirs[name], CONVERSATIONS[1])
    tok = tokenizers.get(f"hf:{dirs[name]}")
    end = "<|im_end|>" if name == "chatml" else "<|eot_id|>"
    trained = tok.decode(ids[mask == 1])
    reply = "  Grüße: rain, 12 °C 🙂 " if name == "chatml" else "Grüße: rain, 12 °C 🙂"
    assert trained == f"It is sunny and warm.{end}{reply}{end}"


@pytest.mark.parametrize("name", ["chatml_plain", "llama3_plain", "features"])
def test_rendering_equals_transformers_with_and_without_generation_prompt(dirs, name):
    tok = transformers.AutoTokenizer.from_pretrained(str(dirs[name]))
    template = chat.load(dirs[name])
    assert not template.marked
    for messages in CONVERSATIONS:
        for prompt in (False, True):
            want = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt)
            assert template.render(messages, add_generation_prompt=prompt) == want
        ids, _ = tokenizers.get(f"hf:{dirs[name]}").encode_with_offsets([template.render(messages)])[0]
        assert ids == tok.apply_chat_template(messages)["input_ids"]


@pytest.mark.parametrize("plain, marked", [("chatml_plain", "chatml"), ("llama3_plain", "llama3")])
def test_mask_derived_from_prefixes_equals_the_marked_templates(dirs, plain, marked):
    for messages in CONVERSATIONS:
        ids, mask = ours(dirs[plain], messages)
        want_ids, want_mask = ours(dirs[marked], messages)
        assert ids.tolist() == want_ids.tolist()
        assert mask.tolist() == want_mask.tolist()
        assert mask.tolist() == reference(dirs[marked], messages)["assistant_masks"]
    assert sum(ours(dirs[plain], CONVERSATIONS[3])[1]) == 0  # no assistant turn: nothing trained


def test_the_template_refuses_what_its_raise_exception_refuses(dirs):
    with pytest.raises(UserError, match="refused the conversation: unknown role tool"):
        chat.load(dirs["features"]).render([{"role": "tool", "content": "x"}])


def test_a_template_whose_prefixes_do_not_prefix_the_whole_is_refused(dirs):
    # FEATURES writes the system text after the turns: a prefix's text is no prefix of the whole
    for messages in CONVERSATIONS[:3]:
        with pytest.raises(UserError, match="does not render a conversation turn after turn"):
            ours(dirs["features"], messages)


def test_templates_are_found_where_transformers_finds_them(tmp_path, dirs):
    tok = bpe(CHATML_SPECIAL)
    # a string in tokenizer_config.json (the format before chat_template.jinja)
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    tok.save(str(legacy / "tokenizer.json"))
    (legacy / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>", "chat_template": CHATML}))
    assert chat.load(legacy).source == CHATML == transformers.AutoTokenizer.from_pretrained(str(legacy)).chat_template
    # a list of named templates: default is used
    named = tmp_path / "named"
    named.mkdir()
    tok.save(str(named / "tokenizer.json"))
    listed = [{"name": "tool_use", "template": "{{ 'tools' }}"}, {"name": "default", "template": CHATML}]
    (named / "tokenizer_config.json").write_text(json.dumps({"chat_template": listed}))
    assert chat.load(named).source == CHATML
    # chat_template.jinja wins over the config's
    (legacy / "chat_template.jinja").write_text("{{ 'from the file' }}")
    assert chat.load(legacy).render([]) == "from the file"
    # none at all
    bare = tmp_path / "bare"
    bare.mkdir()
    tok.save(str(bare / "tokenizer.json"))
    with pytest.raises(UserError, match="has no chat template"):
        chat.load(bare)


def test_special_tokens_are_the_templates_variables(dirs):
    assert chat.special_tokens(dirs["llama3"]) == {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
    assert chat.load(dirs["llama3"]).render([])[:17] == "<|begin_of_text|>"


def test_overlap_mask_rule():
    offsets = [(0, 3), (3, 5), (5, 5), (5, 9), (9, 12)]
    assert chat.overlap_mask(offsets, [(4, 9)]).tolist() == [0, 1, 1, 1, 0]
    assert chat.overlap_mask(offsets, [(0, 3), (9, 10)]).tolist() == [1, 0, 0, 0, 1]
    assert chat.overlap_mask(offsets, []).tolist() == [0] * 5
    assert np.array_equal(chat.overlap_mask([], [(0, 1)]), np.zeros(0, np.uint8))
