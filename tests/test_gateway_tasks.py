"""The gateway's endpoints for the tasks beyond chat and embeddings, against one real serve of a tiny tagger, a tiny
masked LM and a tiny reranker (one tritonserver and one gateway for the whole file): POST /v1/score equals /v1/rerank
and Triton's own scores, POST /v1/models/{model}:predict equals Triton's own JSON, and the playground's views of these
tasks in headless Chromium (entities highlighted at their spans, fill-mask candidates, a ranked list, markup as text)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from hf2triton import host
from hf2triton.gateway.api.playground import PLAYGROUND_FILES
from hf2triton.serving import interface
from hf2triton.triton import client
from tests.helpers import make_workflow, tiny_masked_lm, tiny_reranker, tiny_tagger

TAGGED = "Angela Merkel met Emmanuel Macron in Paris."
MASKED = "The capital of France is [MASK]."
QUERY = "What is the capital of France?"
DOCUMENTS = ["Paris is the capital of France.", "Berlin is in Germany.", "A cat sat on the mat.", "x"]
MARKUP = '<img src=x onerror="window.__ran=1">'


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_models):
    """One serve of the four models with the OpenAI gateway (max_batch_size 4: 6 pairs of one query are 2 requests)."""
    models = tmp_path_factory.mktemp("models")
    entries = [
        {"name": "tag", "source": str(tiny_tagger(models / "tag")), "task": interface.TOKEN_CLASSIFICATION, "max_batch_size": 4},
        {"name": "fill", "source": str(tiny_masked_lm(models / "fill")), "task": interface.FILL_MASK, "max_batch_size": 4},
        {"name": "rank", "source": str(tiny_reranker(models / "rank")), "task": interface.TEXT_RANKING, "max_batch_size": 4},
        {"name": "cls", "source": str(tiny_models[interface.CLASSIFICATION]), "task": interface.CLASSIFICATION, "max_batch_size": 4},
    ]
    workflow = make_workflow(tmp_path_factory.mktemp("tasks-workflow"), entries)
    workflow.config["openai"] = {"enabled": True, "port": host.free_ports(1)[0]}
    workflow.run("serve")
    yield workflow
    workflow.stop()


def post(workflow, path: str, body: dict) -> tuple[int, dict]:
    status, text = client.http_post(f"http://127.0.0.1:{workflow.config['openai']['port']}{path}", body=body, timeout=60)
    return status, json.loads(text)


def triton_rows(workflow, model: str, texts: list[str], options: dict | None, output: str) -> np.ndarray:
    """Triton's own answer over HTTP, in one request (the texts fit the model's batch)."""
    import tritonclient.http as httpclient

    triton = client.http_client(workflow.settings().url())
    return triton.infer(model, client.build_inputs(httpclient, texts, options)).as_numpy(output).reshape(-1)


def test_the_playground_scripts_write_no_markup():
    for name, (path, _) in PLAYGROUND_FILES.items():
        if name.endswith(".js"):
            script = path.read_text(encoding="utf-8")
            assert not re.search(r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|eval\(", script), name


@pytest.mark.integration
def test_score_equals_rerank_and_triton_one_to_many_and_pairwise(served):
    gateway = json.loads((served.directory / "results" / "validation" / "gateway.json").read_text())
    names = {c["name"] for c in gateway["checks"]}
    assert gateway["ok"] and names == {"tag: predict equals Triton", "rank: rerank equals Triton", "rank: score equals Triton"}, gateway
    direct = triton_rows(served, "rank", DOCUMENTS, {interface.QUERY: QUERY}, interface.SCORE)
    status, scored = post(served, "/v1/score", {"model": "rank", "text_1": QUERY, "text_2": DOCUMENTS})
    assert status == 200, scored
    assert set(scored) == {"id", "object", "created", "model", "data", "usage"} and scored["object"] == "list"
    assert scored["id"].startswith("score-") and scored["model"] == "rank"
    assert [d["index"] for d in scored["data"]] == list(range(4)) and {d["object"] for d in scored["data"]} == {"score"}
    assert all(np.float32(d["score"]) == direct[d["index"]] for d in scored["data"]), (scored, direct)
    status, reranked = post(served, "/v1/rerank", {"model": "rank", "query": QUERY, "documents": DOCUMENTS})
    assert status == 200, reranked
    assert {r["index"]: r["relevance_score"] for r in reranked["results"]} == {d["index"]: d["score"] for d in scored["data"]}
    assert scored["usage"] == {"prompt_tokens": reranked["usage"]["total_tokens"], "total_tokens": reranked["usage"]["total_tokens"],
                               "completion_tokens": 0}  # fmt: skip
    # N -> N: two queries interleaved, six pairs; each pair's score is /v1/rerank's for its query and that query's documents
    other = "Where do cats sit?"
    firsts = [QUERY, other, QUERY, other, other, other]
    seconds = ["Paris is the capital of France.", "On mats.", "x", "A cat sat on the mat.", "Berlin is in Germany.", "y"]
    status, pairwise = post(served, "/v1/score", {"model": "rank", "text_1": firsts, "text_2": seconds})
    assert status == 200 and [d["index"] for d in pairwise["data"]] == list(range(6)), pairwise
    tokens = 0
    for query in (QUERY, other):
        indexes = [i for i, first in enumerate(firsts) if first == query]
        status, ranked = post(served, "/v1/rerank", {"model": "rank", "query": query, "documents": [seconds[i] for i in indexes]})
        assert status == 200
        tokens += ranked["usage"]["total_tokens"]
        by_position = {r["index"]: r["relevance_score"] for r in ranked["results"]}
        assert [pairwise["data"][i]["score"] for i in indexes] == [by_position[j] for j in range(len(indexes))], query
    assert pairwise["usage"]["prompt_tokens"] == tokens
    status, refused = post(served, "/v1/score", {"model": "rank", "text_1": ["a", "b"], "text_2": ["c", "d", "e"]})
    assert status == 400 and refused["error"]["param"] == "text_1" and "'text_2' 3" in refused["error"]["message"], refused
    status, refused = post(served, "/v1/score", {"model": "tag", "text_1": "a", "text_2": "b"})
    assert status == 400 and refused["error"]["param"] == "model", refused


@pytest.mark.integration
def test_predict_equals_tritons_own_json(served):
    texts = [TAGGED, "No names here.", MARKUP]
    for strategy in (None, "none", "first"):
        options = {interface.AGGREGATION_STRATEGY: strategy} if strategy else None
        direct = [json.loads(row) for row in triton_rows(served, "tag", texts, options, interface.ENTITIES)]
        status, answer = post(served, "/v1/models/tag:predict", {"instances": texts, **(options or {})})
        assert status == 200 and answer == {"predictions": direct}, (strategy, answer, direct)
    assert any(answer["predictions"][0]) and {"entity_group", "score", "word", "start", "end"} <= set(answer["predictions"][0][0])
    masked = [MASKED, "[MASK] is a city.", "A cat sat on the [MASK]."]
    for top_k in (None, 2):
        options = {interface.TOP_K: top_k} if top_k else None
        direct = [json.loads(row) for row in triton_rows(served, "fill", masked, options, interface.CANDIDATES)]
        status, answer = post(served, "/v1/models/fill:predict", {"instances": masked, **(options or {})})
        assert status == 200 and answer == {"predictions": direct}, (top_k, answer)
        assert [len(p) for p in answer["predictions"]] == [top_k or interface.DEFAULT_FILL_MASK_TOP_K] * 3
    status, refused = post(served, "/v1/models/fill:predict", {"instances": ["no mask"]})
    assert status == 400 and "no mask token" in refused["error"]["message"], refused
    status, refused = post(served, "/v1/models/tag:predict", {"instances": [TAGGED], "top_k": 3})
    assert status == 400 and refused["error"]["param"] == "top_k", refused
    status, refused = post(served, "/v1/models/tag:predict", {"instances": TAGGED})
    assert status == 400 and refused["error"]["param"] == "instances", refused
    status, refused = post(served, "/v1/models/rank:predict", {"instances": [TAGGED]})
    assert status == 400 and refused["error"]["param"] == "model" and "text-ranking" in refused["error"]["message"], refused
    status, refused = post(served, "/v1/models/tag:predict", {"instances": [TAGGED] * 300})
    assert status == 413 and refused["error"]["param"] == "instances", refused


@pytest.fixture(scope="module")
def browser():
    from tests.browser import start_chromium

    driver = start_chromium()
    yield driver
    driver.quit()


@pytest.mark.integration
def test_the_playground_shows_labels_entities_candidates_and_a_ranking_with_markup_as_text(served, browser, tmp_path):
    """The task views against the real gateway: the entities highlighted exactly at the spans :predict answers (markup in
    the text shown literally, never run), fill-mask's candidates in the model's order with their filled sequences, the
    documents ranked best first as /v1/rerank ranks them; no console errors, no request leaving the gateway."""
    from tests.browser import console_errors, fill, foreign, requested_urls, screenshot, text_of, wait_for

    port = served.config["openai"]["port"]
    browser.get(f"http://127.0.0.1:{port}/playground/")
    wait_for(browser, lambda: browser.execute_script("return !document.getElementById('tabs').hidden"))
    shown = browser.execute_script(
        "return [...document.querySelectorAll('#tabs button[data-view]')].filter(b => !b.hidden).map(b => b.dataset.view)"
    )
    assert {"classify", "entities", "fill-mask", "rerank"} <= set(shown), shown
    # classify: each line's label and score, as :predict answers them; markup shown as text
    lines = ["I loved this film.", MARKUP]
    browser.find_element("css selector", "#tabs button[data-view=classify]").click()
    fill(browser, "classify-input", "\n".join(lines))
    browser.find_element("id", "classify-send").click()
    wait_for(browser, lambda: len(browser.find_elements("css selector", "#classify-results li")) == len(lines))
    labels = post(served, "/v1/models/cls:predict", {"instances": lines})[1]["predictions"]
    listed = browser.execute_script(
        "return [...document.querySelectorAll('#classify-results li')].map(li => [li.dataset.label, Number(li.dataset.score), "
        "li.querySelector('.sequence').textContent]);"
    )
    assert listed == [[a["label"], a["score"], line] for a, line in zip(labels, lines)], listed
    assert browser.execute_script("return window.__ran") is None and not browser.find_elements("css selector", "#classify img")
    # entities: each highlighted span is the text between the entity's offsets; the whole text reads as typed
    text = f"{MARKUP} {TAGGED} Ünïcode 🙂 Berlin"
    browser.find_element("css selector", "#tabs button[data-view=entities]").click()
    browser.execute_script("document.getElementById('entities-strategy').value = 'simple';")
    fill(browser, "entities-input", text)
    browser.find_element("id", "entities-send").click()
    wait_for(browser, lambda: "entities;" in (text_of(browser, "#entities-note") or ""))
    entities = post(served, "/v1/models/tag:predict", {"instances": [text], "aggregation_strategy": "simple"})[1]["predictions"][0]
    assert entities, "the tiny tagger finds entities in the text"
    marks = browser.execute_script(
        "return [...document.querySelectorAll('#entities-text mark')].map(m => [Number(m.dataset.start), Number(m.dataset.end), "
        "m.textContent, m.dataset.group, m.title]);"
    )
    assert [(m[0], m[1], m[2]) for m in marks] == [(e["start"], e["end"], text[e["start"] : e["end"]]) for e in entities], marks
    assert all(m[3] == e["entity_group"] and f"{e['score']:.4f}" in m[4] for m, e in zip(marks, entities))
    assert text_of(browser, "#entities-text") == text
    legend = browser.execute_script("return [...document.querySelectorAll('#entities-legend li')].map(li => li.dataset.group)")
    assert legend == sorted({e["entity_group"] for e in entities})
    assert browser.execute_script("return window.__ran") is None and not browser.find_elements("css selector", "#entities img")
    screenshot(browser, "entities", tmp_path)
    # fill mask: top 3 candidates, in the model's order, with the filled sequence
    browser.find_element("css selector", "#tabs button[data-view=fill-mask]").click()
    fill(browser, "fill-input", MASKED)
    fill(browser, "fill-top-k", "3")
    browser.find_element("id", "fill-send").click()
    wait_for(browser, lambda: len(browser.find_elements("css selector", "#fill-candidates li")) == 3)
    candidates = post(served, "/v1/models/fill:predict", {"instances": [MASKED], "top_k": 3})[1]["predictions"][0]
    listed = browser.execute_script(
        "return [...document.querySelectorAll('#fill-candidates li')].map(li => [li.querySelector('.token').textContent, "
        "li.querySelector('.sequence').textContent, Number(li.dataset.score)]);"
    )
    assert listed == [[c["token_str"], c["sequence"], c["score"]] for c in candidates], listed
    screenshot(browser, "fill-mask", tmp_path)
    # rerank: best first, as /v1/rerank; a document with markup shown as text
    documents = [*DOCUMENTS[:3], MARKUP]
    browser.find_element("css selector", "#tabs button[data-view=rerank]").click()
    fill(browser, "rerank-query", QUERY)
    fill(browser, "rerank-documents", "\n".join(documents))
    browser.find_element("id", "rerank-send").click()
    wait_for(browser, lambda: len(browser.find_elements("css selector", "#rerank-results li")) == len(documents))
    ranked = post(served, "/v1/rerank", {"model": "rank", "query": QUERY, "documents": documents})[1]["results"]
    listed = browser.execute_script(
        "return [...document.querySelectorAll('#rerank-results li')].map(li => [Number(li.dataset.index), Number(li.dataset.score), "
        "li.querySelector('.document').textContent]);"
    )
    assert listed == [[r["index"], r["relevance_score"], documents[r["index"]]] for r in ranked], listed
    assert [score for _, score, _ in listed] == sorted((score for _, score, _ in listed), reverse=True)
    assert browser.execute_script("return window.__ran") is None and not browser.find_elements("css selector", "#rerank img")
    screenshot(browser, "rerank", tmp_path)
    assert console_errors(browser) == []
    urls = requested_urls(browser)
    assert any(url.endswith(":predict") for url in urls) and foreign(urls, port) == [], urls
