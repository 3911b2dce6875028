"""What a round's acceptance says, for the gamma policies (gamma_policy.py) and the loops that feed
them: the tokens a round of gamma drafts emits at an acceptance probability, the probability that exact
verification accepts each draft (from both distributions: expected_accept.cu's reference), and the
positions a round tried."""
import numpy as np


def expected_tokens(alpha: float, gamma: np.ndarray) -> np.ndarray:
    """Mean tokens a request emits in a round of `gamma` drafts at acceptance probability alpha."""
    gamma = np.asarray(gamma, np.float64)
    if alpha >= 1.0:
        return gamma + 1.0
    return (1.0 - alpha ** (gamma + 1.0)) / (1.0 - alpha)


def expected_acceptance(xp, draft_logits, target_logits, temperature, draft_len) -> np.ndarray:
    """[B, g] float64 on the host: beta[b, i] = sum_x min(p(x), q(x)), p = softmax(target_logits[b, i] / T),
    q = softmax(draft_logits[b, i] / T) (T: a scalar > 0 or [B]), the probability that exact
    verification accepts draft i of request b sampled from q, given that it reaches it; 0 at positions
    i >= draft_len[b]. draft_logits [B, g, V] and target_logits [B, >= g, V] of module xp (any float
    dtype; computed in float64 on NumPy, float32 on CuPy). The reference of expected_accept.cu."""
    B, g = draft_logits.shape[:2]
    dtype = np.float64 if xp is np else np.float32
    t = xp.asarray(temperature, dtype).reshape(-1, 1, 1)

    def softmax(z):
        z = z.astype(dtype) / t
        e = xp.exp(z - z.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    beta = xp.minimum(softmax(target_logits[:, :g]), softmax(draft_logits)).sum(axis=-1)
    beta = beta.get() if hasattr(beta, "get") else beta
    return np.where(np.arange(g)[None, :] < np.asarray(draft_len).reshape(B, 1), beta.astype(np.float64), 0.0)


def positions_tried(accepted, draft_len):
    """How many draft positions verification reached: the accepted ones and the first rejection, or all
    draft_len when every draft was accepted (a rejection ends a row's successes and is a trial). Ints
    or integer arrays alike."""
    return accepted + (accepted < draft_len)


def expected_accepted(beta: np.ndarray, draft_len: np.ndarray, accepted: np.ndarray) -> np.ndarray:
    """[B] the expected count of accepted drafts at the positions each request tried (positions_tried):
    beta summed over them, AutoGamma's success count in place of `accepted`."""
    tried = positions_tried(np.asarray(accepted), np.asarray(draft_len))
    return np.where(np.arange(beta.shape[1])[None, :] < tried[:, None], beta, 0.0).sum(axis=1)
