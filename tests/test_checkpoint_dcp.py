"""checkpoint.layout: dcp without MPI: what dcp cannot model yet refused before any I/O (one
message naming the key, the value and what is accepted; exit 2), the plan describing the dcp
files, and .metadata's template finishing to dcp_metadata.metadata_bytes' bytes."""

from __future__ import annotations

import json

import pytest

from helpers import run_cli

SMALL = ["checkpoint.layout=dcp", "model.num_layers=2", "model.transformer.hidden_size=64",
         "model.transformer.ffn_hidden_size=128", "model.transformer.vocab_size=512",
         "model.transformer.num_attention_heads=8", "model.transformer.num_kv_heads=2"]


@pytest.mark.parametrize("override,key", [
    ("model.parallelism.tensor=2", "model.parallelism.tensor"),
    ("model.parallelism.pipeline=2 model.parallelism.zero_stage=1",
     "model.parallelism.pipeline"),
    ("checkpoint.checkpoint_mechanism=pt_save", "checkpoint.checkpoint_mechanism"),
    ("checkpoint.odirect=true", "checkpoint.odirect"),
    ("checkpoint.mpiio_hints.striping_factor=4", "checkpoint.mpiio_hints"),
    ("model.layer_parameters=[10,20]", "model.layer_parameters"),
])
def test_what_dcp_cannot_model_is_refused_before_any_io(tmp_path, override, key):
    from dlio_mpi.checkpoint.sizing import checkpoint_layout
    from dlio_mpi.config import load_config
    from dlio_mpi.errors import UserError

    cfg = load_config("llama_8b_zero3", SMALL + override.split(" "))
    with pytest.raises(UserError) as info:
        checkpoint_layout(cfg, 2)
    message = str(info.value)
    assert message.startswith(f"{key}: ") and "checkpoint.layout dcp" in message
    assert "expected" in message and "\n" not in message


def test_a_flat_model_is_refused():
    from dlio_mpi.checkpoint.sizing import checkpoint_layout
    from dlio_mpi.config import load_config
    from dlio_mpi.errors import UserError

    cfg = load_config("unet3d_h100", ["checkpoint.layout=dcp"])
    with pytest.raises(UserError, match="model.num_layers: .*flat model"):
        checkpoint_layout(cfg, 2)


def test_validate_refuses_with_exit_2(tmp_path):
    done = run_cli(["validate", "llama_8b_zero3", "--ranks", "4", *SMALL,
                    "model.parallelism.tensor=2"], ranks=1)
    assert done.returncode == 2, done.stderr
    assert "model.parallelism.tensor: 2 with checkpoint.layout dcp" in done.stderr
    assert "not implemented yet" in done.stderr


def test_the_plan_describes_the_dcp_files(tmp_path):
    from dlio_mpi.checkpoint.dcp_layout import llama_model
    from dlio_mpi.checkpoint.dcp_plan import DcpSavePlan
    from dlio_mpi.config import load_config

    done = run_cli(["validate", "llama_8b_zero3", "--ranks", "3", "--json", *SMALL,
                    "checkpoint.dcp.thread_count=2"], ranks=1)
    assert done.returncode == 0, done.stderr
    ck = json.loads(done.stdout)["checkpoint"]
    plan = DcpSavePlan(llama_model(load_config("llama_8b_zero3", SMALL)), 3, 2)
    sizes = plan.file_sizes()
    assert ck["layout"] == "dcp" and ck["writer"] == "dcp"
    assert ck["dcp"]["distcp_files"] == len(sizes) == 6
    assert ck["dcp"]["distcp_bytes"] == sum(sizes.values())
    assert ck["total_bytes"] == sum(sizes.values()) + ck["dcp"]["metadata_bytes_estimated"]
    text = run_cli(["validate", "llama_8b_zero3", "--ranks", "3", *SMALL], ranks=1).stdout
    assert "dcp: 3 .distcp file(s) (1 per rank" in text


@pytest.mark.parametrize("world,threads", [(2, 1), (3, 2), (7, 1)])
def test_the_metadata_template_gives_metadata_bytes(world, threads):
    """The pickle made once, finished per checkpoint path: byte for byte dcp_plan's."""
    from dlio_mpi.checkpoint.dcp_metadata import MetadataTemplate, metadata_bytes
    from dlio_mpi.checkpoint.dcp_plan import DcpSavePlan, LlamaModel

    plan = DcpSavePlan(LlamaModel(3, 64, 128, 512, 8, 2), world, threads)
    template = MetadataTemplate(plan)
    for path in ("/tmp/ck/global_epoch1_step1", "rel/global_epoch10_step1000"):
        uid = "6b1d2c3e-0000-4000-8000-000000000000"
        assert template.render(path, uid) == metadata_bytes(plan, path, uid)
    assert len(template.render("/a/b")) == len(template.render("/a/b"))  # uuid4: 36 chars
