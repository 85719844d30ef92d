"""The transformers backend: batched sampling, exact log-probs, weight updates."""

from __future__ import annotations

import math

import pytest
import torch

from grpojob_trainer.generation.backend import GenerationRequest, SamplingParams


@pytest.fixture
def backend(tiny_model_dir):
    from grpojob_trainer.generation.transformers_backend import TransformersBackend

    return TransformersBackend(tiny_model_dir, device="cpu", seed=1)


def test_batched_greedy_generation_matches_one_prompt_at_a_time(backend):
    short = GenerationRequest(tuple(range(10, 20)), max_new_tokens=6)
    long = GenerationRequest(tuple(range(10, 40)), max_new_tokens=9)
    greedy = SamplingParams(temperature=0.0, top_p=1.0, max_new_tokens=8)

    alone = [backend.generate([short], greedy)[0], backend.generate([long], greedy)[0]]
    together = backend.generate([short, long], greedy)

    for one, batched in zip(alone, together, strict=True):
        assert one.token_ids == batched.token_ids
        assert one.log_probs == pytest.approx(batched.log_probs, abs=1e-5)
    assert len(together[1].token_ids) <= 8, "the server's max_new_tokens caps a request's own budget"


def test_log_probs_are_those_of_the_sampled_tokens_under_a_full_forward_pass(backend):
    prompt = tuple(range(10, 30))
    result = backend.generate([GenerationRequest(prompt, 12)], SamplingParams(1.0, 1.0, 12))[0]

    sequence = torch.tensor([list(prompt) + list(result.token_ids)])
    with torch.no_grad():
        log_softmax = backend.model(sequence).logits[0].float().log_softmax(-1)
    expected = [log_softmax[len(prompt) - 1 + i, t].item() for i, t in enumerate(result.token_ids)]
    assert result.log_probs == pytest.approx(expected, abs=1e-4)
    assert result.finish_reason == ("stop" if result.token_ids[-1] in backend.stop_token_ids else "length")


def test_update_weights_copies_tensors_in_and_counts_versions(backend):
    zeros = [(name, torch.zeros_like(p)) for name, p in backend.model.state_dict().items() if "norm" not in name]

    version = backend.update_weights(zeros)
    result = backend.generate([GenerationRequest((1, 2, 3), 4)], SamplingParams(1.0, 1.0, 4))[0]

    assert version == backend.weights_version == result.weights_version == 1
    vocab = backend.model.config.vocab_size
    assert result.log_probs == pytest.approx([-math.log(vocab)] * len(result.token_ids), abs=1e-5)


def test_update_weights_refuses_unknown_names_and_wrong_shapes(backend):
    with pytest.raises(KeyError, match="no tensor named 'nope'"):
        backend.update_weights([("nope", torch.zeros(1))])
    with pytest.raises(ValueError, match="shape"):
        backend.update_weights([("model.embed_tokens.weight", torch.zeros(2, 2))])
