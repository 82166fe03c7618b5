"""A verified run samples k+1 positions of one request; each is sampled as the request stood there.

A position view is a shallow copy of the request whose ``token_ids`` end where that position's token
would be appended. The sampler reads only that: penalties count the tokens before the position, the
``min_tokens`` ban counts the outputs before it, and the noise seed is (seed, position), exactly as
when the same token is sampled without speculation.
"""

from __future__ import annotations

import copy

from prefixflow.engine.core.request import Request


def position_views(req: Request) -> list[Request]:
    """One view per verified position: before the first draft, ..., after the last one."""
    first = req.num_tokens - req.num_draft_tokens
    views = []
    for end in range(first, req.num_tokens + 1):
        view = copy.copy(req)
        view.token_ids = req.token_ids[:end]
        view.num_draft_tokens = 0
        views.append(view)
    return views
