"""Validation's request helper without a server: a refusal under the model's queue policy is asked again (the policy the
user configured, not a wrong answer), any other error is reported at once."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as httpclient

from hf2triton.pipeline import validate


class Triton:
    """tritonclient's infer(), refusing the first `refusals` requests with `error`."""

    def __init__(self, refusals: int, error: str):
        self.refusals, self.error, self.calls = refusals, error, 0

    def infer(self, name, inputs):
        self.calls += 1
        if self.calls <= self.refusals:
            raise RuntimeError(self.error)
        return type("Result", (), {"as_numpy": staticmethod(lambda output: np.array([[0.5]], dtype=np.float32))})()


def test_a_queue_policy_refusal_is_asked_again_and_other_errors_are_not(monkeypatch):
    monkeypatch.setattr(validate.time, "sleep", lambda _: None)
    timeout = "[StatusCode.UNAVAILABLE] Request timeout expired"
    triton = Triton(2, timeout)
    outputs, elapsed_ms = validate.infer(triton, httpclient, "embed", "feature-extraction", ["hi"], ("embedding",))
    assert triton.calls == 3 and outputs["embedding"].tolist() == [[0.5]] and elapsed_ms >= 0
    always = Triton(99, "[StatusCode.UNAVAILABLE] Exceeds maximum queue size")
    with pytest.raises(RuntimeError, match="Exceeds maximum queue size"):
        validate.infer(always, httpclient, "embed", "feature-extraction", ["hi"], ("embedding",))
    assert always.calls == validate.QUEUE_ATTEMPTS, "a model that refuses every time still fails validation"
    broken = Triton(99, "unexpected shape")
    with pytest.raises(RuntimeError, match="unexpected shape"):
        validate.infer(broken, httpclient, "embed", "feature-extraction", ["hi"], ("embedding",))
    assert broken.calls == 1
