"""k-means of the offline codec, in float32 torch and deterministic: the semantic tokens are
k-means on the phone encoder's bottleneck, the RVQ stack residual k-means on the normalised mel.
k-means++ initialisation on a seeded subset, then Lloyd iterations (empty clusters take the points
farthest from their centroids); encoding is nearest centroid (and second-nearest, which the token
decoder's input noise uses)."""

from __future__ import annotations

from arnar.codec.base import CodecError
from arnar.codec.offline.features import _torch


def _sq_dist(x, centroids):
    """Squared distances ``[N, K]`` (float32, exact formula, deterministic)."""
    return (x * x).sum(1, keepdim=True) - 2 * x @ centroids.T + (centroids * centroids).sum(1)[None, :]


def _assign(x, centroids, chunk: int = 65536):
    torch = _torch()
    out = []
    for start in range(0, x.shape[0], chunk):
        out.append(torch.argmin(_sq_dist(x[start:start + chunk], centroids), dim=1))
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.long)


def _assign2(x, centroids):
    """Nearest and second-nearest centroid of each row."""
    torch = _torch()
    if centroids.shape[0] < 2:
        first = _assign(x, centroids)
        return first, first
    top = torch.topk(_sq_dist(x, centroids), 2, dim=1, largest=False, sorted=True).indices
    first = _assign(x, centroids)  # argmin's tie rule, as encoding uses
    second = torch.where(top[:, 0] == first, top[:, 1], top[:, 0])
    return first, second


def _kmeans(x, k: int, iters: int, seed: int):
    """k-means++ initialisation (seeded) then Lloyd iterations; empty clusters take the points
    farthest from their centroids. ``x`` float32 tensor ``[N, D]``; returns ``[k, D]``."""
    torch = _torch()
    n = x.shape[0]
    if n == 0:
        raise CodecError("k-means on no data")
    gen = torch.Generator().manual_seed(seed)
    centroids = torch.empty((k, x.shape[1]), dtype=x.dtype)
    # k-means++ on a seeded subset (at most max(4k, 16384) points), Lloyd on all of x
    m = min(n, max(4 * k, 16384))
    init = x if m == n else x[torch.sort(torch.randperm(n, generator=gen)[:m]).values]
    first = int(torch.randint(m, (1,), generator=gen))
    centroids[0] = init[first]
    closest = ((init - centroids[0]) ** 2).sum(1)
    uniform = torch.rand(k, generator=gen, dtype=torch.float64)
    for j in range(1, k):
        cumulative = torch.cumsum(closest.double(), 0)
        total = float(cumulative[-1])
        if total <= 0:  # fewer distinct points than clusters: repeat points
            idx = int(uniform[j] * m) % m
        else:  # a point drawn with probability proportional to its squared distance
            idx = min(int(torch.searchsorted(cumulative, uniform[j] * total)), m - 1)
        centroids[j] = init[idx]
        closest = torch.minimum(closest, ((init - centroids[j]) ** 2).sum(1))
    for _ in range(iters):
        labels = _assign(x, centroids)
        sums = torch.zeros_like(centroids).index_add_(0, labels, x)
        counts = torch.bincount(labels, minlength=k).to(x.dtype)
        empty = torch.nonzero(counts == 0).squeeze(1)
        centroids = torch.where(counts[:, None] > 0, sums / counts.clamp_min(1)[:, None], centroids)
        if empty.numel():
            err = ((x - centroids[labels]) ** 2).sum(1)
            far = torch.argsort(err, descending=True, stable=True)[: empty.numel()]
            centroids[empty[: far.numel()]] = x[far]
    return centroids
