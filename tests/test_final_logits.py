"""The target's logits read from hidden states (target_logits) equal the model's own forward, or the model is
refused at load: HyperCLOVAX multiplies by `logits_scaling` where Granite divides."""

from __future__ import annotations

import json

import pytest
import torch

from specbench.core.batch.decoder import check_final_logits, target_logits
from specbench.core.model.load import load_model
from specbench.errors import SpecbenchError

SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 260, "max_position_embeddings": 256}


def _load(tmp_path, **extra):
    path = tmp_path / f"{extra['model_type']}.json"
    path.write_text(json.dumps({**SMALL, **extra}))
    return load_model(f"random:{path}", dtype="float32", device="cpu")


@pytest.mark.parametrize("model_type,scaling", [("hyperclovax", 4.0), ("granite", 4.0)])
def test_logits_scaling_follows_the_forward(tmp_path, model_type, scaling):
    loaded = _load(tmp_path, model_type=model_type, logits_scaling=scaling)  # load runs check_final_logits
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    out = loaded.model(input_ids=ids, output_hidden_states=True)
    assert torch.allclose(target_logits(loaded.model, out.hidden_states[-1]), out.logits.float(), atol=1e-4)


def test_an_unknown_logit_processing_is_refused(tmp_path):
    loaded = _load(tmp_path, model_type="llama")
    loaded.model.config.logits_scaling = 3.0  # a field a Llama forward ignores: target_logits would divide by it
    with pytest.raises(SpecbenchError, match="final logits differ"):
        check_final_logits(loaded.model, "odd-llama", torch.device("cpu"))
