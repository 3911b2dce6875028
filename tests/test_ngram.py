"""Prompt-lookup drafts (specsample_cupy/decode/ngram.py): hand-made histories, argument errors, the NumPy
path against a plain-loop reference on random histories, and the kernel against the NumPy path."""
import numpy as np
import pytest

from specsample_cupy.decode.ngram import propose_ngram

PAD = -1


def propose_one(history, *, gamma, limit=100, eos=(), finished=False, ngram_min=1, ngram_max=4, junk=()):
    """One request's proposal as a list; `junk`: columns past the history (must never be read)."""
    seq = np.array([list(history) + list(junk)], np.int64).reshape(1, -1)
    tokens, length = propose_ngram(seq, [len(history)], [finished], [limit], np.array(eos, np.int64),
                                   gamma=gamma, ngram_min=ngram_min, ngram_max=ngram_max, pad_id=PAD)
    assert tokens.shape == (1, gamma) and tokens.dtype == np.int32 and length.dtype == np.int32
    n = int(length[0])
    assert (tokens[0, n:] == PAD).all(), "positions past the proposal hold the pad id"
    return tokens[0, :n].tolist()


# ---- hand-made histories ----

def test_no_earlier_occurrence_proposes_nothing():
    assert propose_one([1, 2, 3, 4], gamma=4) == []


def test_the_most_recent_occurrence_wins():
    # suffix [1] occurs at 1 (then 7) and at 3 (then 8, 9, 1); no longer suffix occurs earlier
    assert propose_one([5, 1, 7, 1, 8, 9, 1], gamma=3) == [8, 9, 1]


def test_the_longest_ngram_wins_over_a_more_recent_shorter_one():
    history = [1, 2, 3, 7, 9, 3, 8, 2, 3]   # [2, 3] at 1 (then 7); [3] most recently at 5 (then 8)
    assert propose_one(history, gamma=3) == [7, 9, 3]
    assert propose_one(history, gamma=3, ngram_max=1) == [8, 2, 3]


def test_the_continuation_is_cut_at_the_end_of_the_history():
    assert propose_one([5, 1, 7, 1, 8, 9, 1], gamma=8) == [8, 9, 1]
    assert propose_one([4, 4, 4], gamma=4) == [4]                 # [4, 4] at 0 overlaps the suffix
    assert propose_one([1, 2, 1, 2, 1], gamma=5) == [2, 1]        # [1, 2, 1] at 0


def test_the_proposal_is_cut_by_gamma():
    assert propose_one([5, 1, 7, 1, 8, 9, 1], gamma=2) == [8, 9]
    assert propose_one([5, 1, 7, 1, 8, 9, 1], gamma=0) == []


def test_the_proposal_leaves_room_for_the_rounds_own_token():
    history = [5, 1, 7, 1, 8, 9, 1]
    assert propose_one(history, gamma=3, limit=3) == [8, 9]
    assert propose_one(history, gamma=3, limit=4) == [8, 9, 1]
    for limit in (1, 0, -5):
        assert propose_one(history, gamma=3, limit=limit) == []


def test_the_proposal_stops_after_its_first_eos():
    history = [5, 1, 7, 1, 8, 9, 1]
    assert propose_one(history, gamma=3, eos=[9]) == [8, 9]
    assert propose_one(history, gamma=3, eos=[9, 8]) == [8]
    assert propose_one(history, gamma=3, eos=[1]) == [8, 9, 1]
    assert propose_one(history, gamma=3, eos=[5, 7]) == [8, 9, 1], "EOS ids elsewhere in the history do not cut"


def test_finished_requests_propose_nothing():
    assert propose_one([5, 1, 7, 1, 8, 9, 1], gamma=3, finished=True) == []


def test_ngram_bounds():
    history = [1, 2, 3, 7, 9, 3, 8, 2, 3]
    assert propose_one(history, gamma=3, ngram_min=2) == [7, 9, 3]
    assert propose_one(history, gamma=3, ngram_min=3) == [], "no earlier [8, 2, 3] or longer"
    long_match = [1, 2, 3, 4, 5, 6, 0, 9, 2, 3, 4, 5, 6]   # [2..6] at 1 (then 0); [6] also only there
    assert propose_one(long_match, gamma=2, ngram_max=2) == [0, 9]
    assert propose_one(long_match, gamma=2, ngram_min=5, ngram_max=5) == [0, 9]
    assert propose_one(long_match, gamma=2, ngram_min=6, ngram_max=8) == []


def test_lengths_not_below_the_history_length_are_skipped():
    assert propose_one([], gamma=3) == []
    assert propose_one([7], gamma=3) == []
    assert propose_one([7, 7], gamma=3) == [7]
    assert propose_one([7, 7], gamma=3, ngram_min=2) == [], "k = 2 >= n = 2 has no earlier occurrence"


def test_columns_past_the_history_are_never_read():
    assert propose_one([5, 6, 5], gamma=3, junk=[6, 6, 5]) == [6, 5]
    assert propose_one([5, 6], gamma=3, junk=[5, 6, 5]) == []


def test_a_batch_of_rows_with_different_lengths():
    seq = np.array([[5, 1, 7, 1, 8, 9, 1],
                    [4, 4, 4, 0, 0, 0, 0],
                    [1, 2, 3, 4, 0, 0, 0]], np.int64)
    tokens, length = propose_ngram(seq, [7, 3, 4], [False, False, False], [10, 10, 10], np.array([], np.int64),
                                   gamma=3, pad_id=PAD)
    assert length.tolist() == [3, 1, 0]
    assert tokens.tolist() == [[8, 9, 1], [4, PAD, PAD], [PAD, PAD, PAD]]


# ---- argument errors ----

@pytest.mark.parametrize("kwargs, name", [
    (dict(gamma=-1), "gamma"), (dict(gamma=1.5), "gamma"), (dict(gamma=True), "gamma"),
    (dict(gamma=2, ngram_min=0), "ngram_min"), (dict(gamma=2, ngram_min=3, ngram_max=2), "ngram_min"),
    (dict(gamma=2, ngram_max=2.0), "ngram_max"), (dict(gamma=2, pad_id=2 ** 31), "pad_id"),
])
def test_bad_arguments_name_themselves(kwargs, name):
    seq = np.zeros((1, 4), np.int64)
    with pytest.raises(ValueError, match=name):
        propose_ngram(seq, [2], [False], [5], np.array([], np.int64), **kwargs)


@pytest.mark.parametrize("args, name", [
    ((np.zeros(4, np.int64), [2], [False], [5], []), "seq"),
    ((np.zeros((2, 4), np.int64), [2], [False, False], [5, 5], []), "seq_len"),
    ((np.zeros((1, 4), np.int64), [2], [False, True], [5], []), "finished"),
    ((np.zeros((1, 4), np.int64), [2], [False], [], []), "limit"),
    ((np.zeros((1, 4), np.int64), [2], [False], [5], [[1]]), "eos_ids"),
    ((np.zeros((1, 4), np.int64), [5], [False], [5], []), "seq_len"),
    ((np.zeros((1, 4), np.int64), [-1], [False], [5], []), "seq_len"),
])
def test_bad_shapes_and_lengths_name_their_array(args, name):
    seq, seq_len, finished, limit, eos = args
    with pytest.raises(ValueError, match=name):
        propose_ngram(seq, seq_len, finished, limit, np.array(eos, np.int64), gamma=2)


# ---- random histories ----

def naive_proposal(history, finished, limit, eos, gamma, ngram_min, ngram_max):
    """The rule's loops as written: longest k first, then the latest start, then the cuts."""
    if finished:
        return []
    n = len(history)
    for k in range(ngram_max, ngram_min - 1, -1):
        if k >= n:
            continue
        suffix = history[n - k:]
        for s in range(n - 1 - k, -1, -1):
            if history[s:s + k] == suffix:
                proposal = history[s + k:s + k + gamma][:max(0, limit - 1)]
                for i, token in enumerate(proposal):
                    if token in eos:
                        return proposal[:i + 1]
                return proposal
    return []


def random_histories(rng, B, P, vocab):
    """[B, P] int64: uniform tokens, or (mostly) a short motif repeated with a fifth of the tokens
    changed, so that long n-grams recur too."""
    seq = rng.integers(0, vocab, (B, P))
    if rng.random() < 0.7:
        motif = rng.integers(0, vocab, int(rng.integers(2, 8)))
        repeated = np.resize(motif, (B, P))
        seq = np.where(rng.random((B, P)) < 0.2, seq, repeated)
    return seq.astype(np.int64)


def random_batch(rng):
    """One random call: small vocabularies (frequent matches), short budgets now and then, junk past
    each history, and now and then a history longer than a block's 256 threads."""
    B = int(rng.integers(1, 9))
    P = int(rng.integers(300, 700)) if rng.random() < 0.05 else int(rng.integers(0, 40))
    vocab = int(rng.integers(3, 21))
    ngram_min = int(rng.choice([1, 1, 2, 2, 3, 4]))
    return dict(
        seq=random_histories(rng, B, P, vocab),
        seq_len=np.where(rng.random(B) < 0.5, P, rng.integers(0, P + 1, B)).astype(np.int64),
        finished=rng.random(B) < 0.15,
        limit=np.where(rng.random(B) < 0.3, rng.integers(-1, 10, B), 1000).astype(np.int64),
        eos_ids=rng.choice(vocab, int(rng.integers(0, 4)), replace=False).astype(np.int64),
        gamma=int(rng.integers(0, 9)), ngram_min=ngram_min, ngram_max=ngram_min + int(rng.integers(0, 4)),
        pad_id=int(rng.integers(-3, 3)))


def test_numpy_path_equals_the_plain_loops_on_random_histories():
    rng = np.random.default_rng(11)
    histories = proposed = eos_cut = 0
    while histories < 1500:
        case = random_batch(rng)
        tokens, length = propose_ngram(**case)
        eos = set(case["eos_ids"].tolist())
        for b in range(case["seq"].shape[0]):
            history = case["seq"][b, :case["seq_len"][b]].tolist()
            want = naive_proposal(history, bool(case["finished"][b]), int(case["limit"][b]), eos, case["gamma"],
                                  case["ngram_min"], case["ngram_max"])
            assert length[b] == len(want), (case, b)
            assert tokens[b].tolist() == want + [case["pad_id"]] * (case["gamma"] - len(want)), (case, b)
            histories += 1
            proposed += bool(want)
            eos_cut += bool(want) and want[-1] in eos
    assert proposed > histories // 4 and eos_cut > 50, "the random cases reach every cut"


@pytest.mark.gpu
def test_kernel_equals_numpy_path_on_random_histories():
    import cupy
    from specsample_cupy.decode.ngram import propose_ngram_device
    rng = np.random.default_rng(12)
    histories = 0
    for i in range(600):
        case = random_batch(rng)
        want_tokens, want_length = propose_ngram(**case)
        B, P = case["seq"].shape
        gamma = case["gamma"]
        # Vary what the kernel reads in place: row pitches wider than a row, int32 or int64 counts,
        # bool or int64 flags; the buffers start full of garbage and must be overwritten.
        wide_seq = cupy.full((B, P + i % 3), 99, cupy.int64)
        wide_seq[:, :P] = cupy.asarray(case["seq"])
        counts = cupy.int32 if i % 2 else cupy.int64
        tokens = cupy.full((B, gamma + i % 2), -7, cupy.int32)[:, :gamma]
        length = cupy.full(B, -7, cupy.int32)
        # Every fourth call passes the limit as the length where the budget ends (the device loop's form).
        as_end = i % 4 == 0
        limit = np.asarray(case["limit"]) + (np.asarray(case["seq_len"]) if as_end else 0)
        propose_ngram_device(wide_seq[:, :P], cupy.asarray(case["seq_len"], counts),
                             cupy.asarray(case["finished"], bool if i % 3 else cupy.int64),
                             cupy.asarray(limit, counts), cupy.asarray(case["eos_ids"], counts),
                             tokens, length, gamma=gamma, ngram_min=case["ngram_min"],
                             ngram_max=case["ngram_max"], pad_id=case["pad_id"], limit_is_end=as_end)
        assert (cupy.asnumpy(length) == want_length).all(), (case, cupy.asnumpy(length), want_length)
        assert (cupy.asnumpy(tokens) == want_tokens).all(), (case, cupy.asnumpy(tokens), want_tokens)
        histories += B
    assert histories >= 1000
