"""Issue 44 #5: tool calling on /v1/chat/completions (`tools`, `tool_choice`). The parsers (hermes, llama3_json) and
their streamed deltas on hand-written answers; the model side's templating of tools and tool messages; then the real
gateway in front of a real tritonserver serving a tiny random Llama given a Qwen2.5-style (Hermes) chat template: it
cannot decide to call a tool, so `tool_choice` required / named -- enforced by constrained decoding -- is what makes its
answer a call, which the official `openai` client (whole and streamed) and LangChain read back."""

from __future__ import annotations

import json
import shutil
from typing import Literal

import pytest

from hf2triton.gateway.errors import ApiError
from hf2triton.gateway.protocol import ServedModel
from hf2triton.gateway.tool_parsers import ToolStream, parse_tool_calls, tool_message
from hf2triton.gateway.tools import guided, tool_request
from hf2triton.serving import inputs, interface

# Qwen2.5's template, shortened (its system prompt and tool/response tags as they are)
HERMES_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": '
    "<args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) or "
    "(message.role == 'assistant' and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>' + message.role }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    '{{- \'\\n<tool_call>\\n{"name": "\' + tool_call.name + \'", "arguments": \' }}{{- tool_call.arguments | tojson }}'
    "{{- '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# Llama 3.1's JSON tool calling, shortened (its instruction as it is; ChatML headers, which this tokenizer has)
LLAMA3_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message.role == 'user' and loop.last and tools %}{{- '<|im_start|>user\n' }}"
    "{{- 'Given the following functions, please respond with a JSON for a function call with its proper arguments that "
    'best answers the given prompt.\n\nRespond in the format {"name": function name, "parameters": dictionary of '
    "argument name and its value}. Do not use variables.\n\n' }}"
    "{%- for tool in tools %}{{- tool | tojson + '\n\n' }}{%- endfor %}{{- message.content + '<|im_end|>\n' }}"
    "{%- elif message.role == 'assistant' and message.tool_calls %}"
    "{%- set call = message.tool_calls[0].function %}"
    "{{- '<|im_start|>assistant\n{\"name\": \"' + call.name + '\", \"parameters\": ' + call.arguments | tojson + '}<|im_end|>\n' }}"
    "{%- else %}{{- '<|im_start|>' + ('ipython' if message.role == 'tool' else message.role) + '\n' + message.content + '<|im_end|>\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo"]}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
}
TIME = {"type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["zone"]}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": "The time in a zone.", "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
HERMES = (
    'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_time", "arguments": {"zone": "a } \\" ; b"}}\n</tool_call>'
)


def served_model(tool_parser: str = "hermes") -> ServedModel:
    return ServedModel("chat", interface.GENERATION, True, 0, tool_parser=tool_parser)


# ------------------------------------------------------------------ parsers (no server)


def assembled(parser: str, text: str, step: int) -> tuple[str, list[dict], bool]:
    """`text` streamed `step` characters at a time: the content and the calls a client assembles from the deltas."""
    stream, deltas = ToolStream(parser), []
    for at in range(0, len(text), step):
        deltas += stream.feed(text[at : at + step])
    deltas += stream.finish()
    calls: dict[int, dict] = {}
    for delta in deltas:
        for item in delta.get("tool_calls", []):
            if "id" in item:  # the first delta of a call: index, id, type, name, arguments ""
                assert item["id"].startswith("call_") and item["type"] == "function" and item["function"]["arguments"] == ""
                assert item["index"] not in calls
                calls[item["index"]] = {"name": item["function"]["name"], "arguments": ""}
            calls[item["index"]]["arguments"] += item["function"]["arguments"]
    return "".join(d.get("content", "") for d in deltas), [calls[i] for i in sorted(calls)], stream.called


def test_hermes_finds_every_call_with_text_around():
    content, calls = parse_tool_calls("hermes", HERMES)
    assert content == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris", "unit": "celsius"}),
        ("get_time", {"zone": 'a } " ; b'}),
    ]
    message, final = tool_message("hermes", HERMES, {"finish_reason": "stop"})
    assert final["finish_reason"] == "tool_calls" and message["content"] == "Let me check."
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather", "get_time"]
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in message["tool_calls"])
    assert tool_message("hermes", HERMES, {"finish_reason": "length"})[1] == {"finish_reason": "length"}  # cut: says so
    unclosed = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}'  # cut before its end tag: still a call
    assert parse_tool_calls("hermes", unclosed)[1][0].name == "get_time"


@pytest.mark.parametrize(
    "text",
    [
        'I will call <tool_call>{"name": "get_time", "arguments": {"zone": }}</tool_call>',  # malformed JSON
        '<tool_call>{"name": "get_time"}</tool_call>',  # no arguments
        '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": 3, "arguments": {}}</tool_call>',  # one bad
        "no call at all",
    ],
)
def test_hermes_keeps_an_answer_whose_calls_do_not_parse_as_content(text):
    assert parse_tool_calls("hermes", text) == (text, [])
    assert tool_message("hermes", text, {"finish_reason": "stop"}) == ({"content": text}, {"finish_reason": "stop"})


def test_llama3_json_reads_one_or_more_objects_after_the_python_tag():
    content, calls = parse_tool_calls("llama3_json", '<|python_tag|>{"name": "get_time", "parameters": {"zone": "CET"}}')
    assert content is None and [(c.name, json.loads(c.arguments)) for c in calls] == [("get_time", {"zone": "CET"})]
    two = ' {"name": "a", "parameters": {"x": "1;2"}}; {"name": "b", "arguments": {}}'
    assert [c.name for c in parse_tool_calls("llama3_json", two)[1]] == ["a", "b"]
    for text in ("The answer is 4.", '{"name": "a", "parameters": {}} and more', '{"answer": 4}'):
        assert parse_tool_calls("llama3_json", text) == (text, [])


@pytest.mark.parametrize("step", [1, 2, 5, 1000])
def test_streamed_deltas_assemble_to_the_whole_answers_calls(step):
    content, calls, called = assembled("hermes", HERMES, step)
    whole = parse_tool_calls("hermes", HERMES)[1]
    assert called and content.strip() == "Let me check."
    assert calls == [{"name": c.name, "arguments": c.arguments} for c in whole]
    text = '<|python_tag|>{"name": "get_time", "parameters": {"zone": "UTC"}}'
    assert assembled("llama3_json", text, step)[1] == [{"name": "get_time", "arguments": '{"zone": "UTC"}'}]


def test_streamed_text_is_held_back_only_while_it_may_become_a_call():
    stream = ToolStream("hermes")
    assert stream.feed("Sunny <tool") == [{"content": "Sunny "}]  # "<tool" may be the start of <tool_call>
    assert stream.feed("s> here") == [{"content": "<tools> here"}]
    bad = "<tool_call>{no json}</tool_call>"
    assert assembled("hermes", bad, 3) == (bad, [], False)  # never a call: its text comes out as content
    llama = ToolStream("llama3_json")
    assert llama.feed("  ") == [] and llama.feed("It is") == [{"content": "  It is"}] and llama.feed(" 4") == [{"content": " 4"}]


# ------------------------------------------------------------------ the request side (no server)


def test_tools_are_refused_for_a_model_without_a_tool_parser():
    with pytest.raises(ApiError) as refused:
        tool_request({"tools": TOOLS}, served_model("none"))
    assert refused.value.status == 400 and refused.value.param == "tools"
    assert "generation.tool_parser" in refused.value.message and "'chat'" in refused.value.message


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools[0].function.name"),
        ({"tools": [{"type": "retrieval"}]}, "tools[0]"),
        ({"tools": TOOLS + TOOLS[:1]}, "tools"),
        ({"tools": TOOLS, "tool_choice": "always"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ],
)
def test_tool_mistakes_are_400s_naming_the_parameter(body, param):
    with pytest.raises(ApiError) as refused:
        tool_request(body, served_model())
    assert refused.value.status == 400 and refused.value.param == param


def test_null_description_and_parameters_are_taken_as_absent():
    """Pydantic-based clients send unset fields as null; vLLM's FunctionDefinition takes both as optional."""
    tool = {"type": "function", "function": {"name": "now", "description": None, "parameters": None}}
    assert tool_request({"tools": [tool]}, served_model()).tools == [{"type": "function", "function": {"name": "now"}}]


def accepts(constraint: dict, text: str) -> bool:
    import xgrammar

    if constraint["kind"] == "grammar":
        grammar = xgrammar.Grammar.from_ebnf(constraint["value"])
    else:
        grammar = xgrammar.Grammar.from_json_schema(json.dumps(constraint["value"]), any_whitespace=False)
    return xgrammar.testing._is_grammar_accept_string(grammar, text)


def test_required_and_named_choices_build_the_parsers_constraint():
    weather = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Tokyo", "unit": "fahrenheit"}}\n</tool_call>'
    clock = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>'
    required = guided(tool_request({"tools": TOOLS, "tool_choice": "required"}, served_model()), "hermes")
    assert required["kind"] == "grammar" and accepts(required, weather) and accepts(required, f"{weather}\n{clock}")
    assert not accepts(required, "Sure!") and not accepts(required, weather.replace("Tokyo", "Rome"))
    single = guided(tool_request({"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False}, served_model()), "hermes")
    assert accepts(single, clock) and not accepts(single, f"{weather}\n{clock}")
    named = {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_time"}}}
    assert accepts(guided(tool_request(named, served_model()), "hermes"), clock)
    assert not accepts(guided(tool_request(named, served_model()), "hermes"), weather)
    llama = guided(tool_request(named, served_model("llama3_json")), "llama3_json")
    assert llama["kind"] == "json_schema" and accepts(llama, '{"name": "get_time", "parameters": {"zone": "CET"}}')
    for choice in ("auto", "none"):
        assert guided(tool_request({"tools": TOOLS, "tool_choice": choice}, served_model()), "hermes") is None
    rooted = {"type": "object", "properties": {"root": {"enum": ["root", "[root]"]}}, "required": ["root"]}  # the rule's name
    rooted_tools = [{"type": "function", "function": {"name": "root", "parameters": rooted}}]
    rooted_choice = guided(tool_request({"tools": rooted_tools, "tool_choice": "required"}, served_model()), "hermes")
    assert accepts(rooted_choice, '<tool_call>\n{"name": "root", "arguments": {"root": "[root]"}}\n</tool_call>')
    bad = [{"type": "function", "function": {"name": "f", "parameters": {"type": "objectx"}}}]
    with pytest.raises(ApiError) as refused:
        guided(tool_request({"tools": bad, "tool_choice": "required"}, served_model()), "hermes")
    assert refused.value.param == "tools" and "objectx" in refused.value.message


# ------------------------------------------------------------------ the model side's templating (no server)


def hermes_tokenizer(source, template: str = HERMES_TEMPLATE):
    """`source`'s tokenizer with a chat template that renders tools (Qwen2.5's Hermes one unless told)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source)
    tokenizer.chat_template = template
    return tokenizer


CONVERSATION = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees"},
]


def test_the_template_renders_tools_and_a_conversation_with_calls(tiny_models):
    tokenizer = hermes_tokenizer(tiny_models["text-generation"])
    prompt = inputs.chat_prompt(tokenizer, [json.dumps(CONVERSATION)], [json.dumps(TOOLS)])
    assert '"name": "get_weather"' in prompt and "<tools>" in prompt
    # the arguments' JSON text handed to the template as an object (its `tojson` would quote a string)
    assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in prompt
    assert "<tool_response>\n18 degrees\n</tool_response>" in prompt and prompt.endswith("<|im_start|>assistant\n")


def test_tools_for_a_template_without_tool_support_name_the_model_and_the_fix(tiny_models):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_models["text-generation"])  # SmolLM2's template: no tools
    with pytest.raises(inputs.RequestError, match="does not render tools") as refused:
        inputs.chat_prompt(tokenizer, [json.dumps(CONVERSATION[:1])], [json.dumps(TOOLS)])
    assert str(tiny_models["text-generation"]) in str(refused.value) and "chat_template" in str(refused.value)


def test_tool_parser_is_checked_in_the_config_and_against_the_template_at_render(tiny_models, tmp_path):
    from hf2triton.config import validate_config
    from hf2triton.errors import UserError
    from hf2triton.pipeline.render import check_tool_template
    from hf2triton.specs import GenerationSpec, ModelSpec, serving_values

    def config(task: str, parser: str) -> dict:
        return {"models": [{"name": "m", "source": "org/m", "task": task, "generation": {"tool_parser": parser}}]}

    with pytest.raises(UserError, match="tool_parser = 'qwen': not allowed") as refused:
        validate_config(config("text-generation", "qwen"))
    assert "hermes" in refused.value.fix
    with pytest.raises(UserError, match="only for task text-generation"):
        validate_config(config("text2text-generation", "hermes"))
    model = ModelSpec(name="g", source="org/g", task="text-generation", generation=GenerationSpec(tool_parser="hermes"))
    serving = serving_values(model, gpu_available=False, cpus=1)
    with pytest.raises(UserError, match="does not render tools") as refused:  # SmolLM2's template has no tools
        check_tool_template(serving, str(tiny_models["text-generation"]))
    assert "remove generation.tool_parser" in refused.value.fix
    hermes_tokenizer(tiny_models["text-generation"]).save_pretrained(tmp_path)
    check_tool_template(serving, str(tmp_path))


# ------------------------------------------------------------------ through the gateway (real server, real clients)


@pytest.fixture(scope="module")
def gateway_url(tmp_path_factory):
    from hf2triton import host
    from tests.helpers import make_workflow, on_test_backend, tiny_llama

    root = tmp_path_factory.mktemp("tools-models")
    path = tiny_llama(root / "hermes", 1024)  # room for the tools in its prompt
    shutil.copytree(path, root / "llama3")  # the same weights, with Llama 3.1's way of calling
    hermes_tokenizer(path).save_pretrained(path)
    hermes_tokenizer(path, LLAMA3_TEMPLATE).save_pretrained(root / "llama3")
    entries = []
    for name, parser in (("chat", "hermes"), ("chat3", "llama3_json")):
        entry = {"name": name, "source": str(root / parser.split("_")[0]), "task": "text-generation", "max_batch_size": 4}
        entries.append({**entry, "generation": {"max_new_tokens": 8, "max_sequences": 4, "tool_parser": parser}})
    workflow = make_workflow(tmp_path_factory.mktemp("tools"), on_test_backend(entries))
    workflow.config["openai"] = {"enabled": True, "port": host.free_ports(1)[0]}
    workflow.run("serve")
    yield f"http://127.0.0.1:{workflow.config['openai']['port']}/v1"
    workflow.stop()


def check_call(call, names=("get_weather", "get_time")) -> None:
    import jsonschema

    assert call.id.startswith("call_") and call.function.name in names
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
FORCED = {"max_tokens": 200, "parallel_tool_calls": False}


@pytest.mark.integration
def test_openai_client_gets_a_forced_call_whole_and_streamed(gateway_url):
    from openai import OpenAI

    client = OpenAI(base_url=gateway_url, api_key="x")
    answer = client.chat.completions.create(model="chat", messages=ASK, tools=TOOLS, tool_choice="required", **FORCED)
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
    check_call(choice.message.tool_calls[0])
    named = {"type": "function", "function": {"name": "get_time"}}
    with client.chat.completions.stream(model="chat", messages=ASK, tools=TOOLS, tool_choice=named, **FORCED) as stream:
        final = stream.get_final_completion()
    assert final.choices[0].finish_reason == "tool_calls"
    check_call(final.choices[0].message.tool_calls[0], names=("get_time",))


@pytest.mark.integration
def test_llama3_json_calls_stream_as_openai_deltas(gateway_url):
    """The llama3_json model's forced call (a JSON schema constraint), streamed: the first delta of the call carries
    its index, id, type, name and arguments "", the next ones fragments of the arguments, the last the finish reason."""
    from openai import OpenAI

    client = OpenAI(base_url=gateway_url, api_key="x")
    named = {"type": "function", "function": {"name": "get_weather"}}
    chunks = list(client.chat.completions.create(model="chat3", messages=ASK, tools=TOOLS, tool_choice=named, stream=True, **FORCED))
    deltas = [call for chunk in chunks if chunk.choices for call in chunk.choices[0].delta.tool_calls or []]
    first, rest = deltas[0], deltas[1:]
    assert first.index == 0 and first.id.startswith("call_") and first.type == "function"
    assert first.function.name == "get_weather" and first.function.arguments == ""
    assert all(d.index == 0 and d.id is None and d.function.name is None for d in rest)
    arguments = json.loads("".join(d.function.arguments for d in rest))
    assert set(arguments) == {"city", "unit"} and arguments["city"] in ("Paris", "Tokyo")
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    answer = client.chat.completions.create(model="chat3", messages=ASK, tools=TOOLS, tool_choice=named, **FORCED)
    check_call(answer.choices[0].message.tool_calls[0], names=("get_weather",))
    assert answer.choices[0].message.content is None


@pytest.mark.integration
def test_a_conversation_with_calls_and_results_is_answered(gateway_url):
    from openai import BadRequestError, OpenAI

    client = OpenAI(base_url=gateway_url, api_key="x")
    for choice in ("auto", "none"):
        answer = client.chat.completions.create(model="chat", messages=CONVERSATION, tools=TOOLS, tool_choice=choice, max_tokens=4)
        assert answer.choices[0].message.role == "assistant" and answer.usage.completion_tokens >= 1
    with pytest.raises(BadRequestError) as refused:  # two constraints for one answer
        client.chat.completions.create(
            model="chat", messages=ASK, tools=TOOLS, tool_choice="required", response_format={"type": "json_object"}
        )
    assert refused.value.body["param"] == "tool_choice"


@pytest.mark.integration
def test_langchain_bind_tools_required_yields_parsed_tool_calls(gateway_url):
    from langchain_openai import ChatOpenAI

    def get_weather(city: Literal["Paris", "Tokyo"], unit: Literal["celsius", "fahrenheit"]) -> str:
        """The weather in a city."""
        return f"18 {unit} in {city}"

    llm = ChatOpenAI(base_url=gateway_url, api_key="x", model="chat", max_tokens=200, max_retries=0)
    message = llm.bind_tools([get_weather], tool_choice="required", parallel_tool_calls=False).invoke("Weather in Tokyo?")
    assert len(message.tool_calls) == 1 and message.tool_calls[0]["name"] == "get_weather"
    assert message.tool_calls[0]["args"]["city"] in ("Paris", "Tokyo")
    assert get_weather(**message.tool_calls[0]["args"]).startswith("18 ")
