"""SpeculativeDecoder(cpu_threads=N): ONNX Runtime's CPU sessions use N threads per run (Ray's CPU
workers take one each), with the same tokens as the default."""
from specsample_cupy.decode.decoder import SpeculativeDecoder


def test_cpu_threads_sets_the_sessions_and_keeps_the_tokens():
    one = SpeculativeDecoder(device="cpu", cpu_threads=1)
    default = SpeculativeDecoder(device="cpu")
    for session in (one.target.session, one.draft.session):
        assert session.get_session_options().intra_op_num_threads == 1
    assert default.target.session.get_session_options().intra_op_num_threads == 0   # ONNX Runtime's own choice
    kw = dict(max_new_tokens=12, gamma=3, temperature=0.8, seed=2)
    assert one.generate(["import os\n", "def f():"], **kw).token_ids == \
        default.generate(["import os\n", "def f():"], **kw).token_ids
