"""Quokka's REST inputs of 2023 (`InputRestGetAPIDataset`, `InputRestPostAPIDataset`): one request per argument.

Readers of Quokka's 2023 protocol: `get_own_state(n)` deals the arguments to the channels in runs
of `batch_size` (run i to channel i % n), and `execute(channel, (start, end))` sends the requests of
one run at once (aiohttp, each bounded by `timeout` seconds) and gives their answers as one polars
frame of the `projection` columns. As in Quokka, a request that fails is left out (and logged as a
warning), and a GET answer missing a projected key has it as null.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from typing import Any

import aiohttp

from ...graph import GraphError
from .frames import polars_module

log = logging.getLogger(__name__)


class _Requests:
    """What both inputs share: the arguments, their runs, the projection."""

    def __init__(
        self, url: str, arguments: Sequence[Any], headers: Any, projection: Sequence[str] | None, batch_size: int, timeout: float
    ) -> None:
        if projection is None and isinstance(headers, list | tuple) and all(isinstance(h, str) for h in headers):
            headers, projection = None, headers  # the tutorial's call: the columns given where the headers go
        if projection is None or isinstance(projection, str):
            raise GraphError(f"{type(self).__name__}: give the projection, the list of keys kept as columns")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise GraphError(f"{type(self).__name__}: batch_size must be an int of at least 1, got {batch_size!r}")
        self.url, self.arguments, self.headers = url, list(arguments), headers
        self.projection, self.batch_size, self.timeout = list(projection), batch_size, timeout

    def get_own_state(self, num_channels: int) -> dict[int, list[tuple[int, int]]]:
        """Runs of `batch_size` arguments, run i to channel i % num_channels."""
        runs = [
            (start, min(start + self.batch_size, len(self.arguments))) for start in range(0, len(self.arguments), self.batch_size)
        ]
        return {c: runs[c::num_channels] for c in range(num_channels) if runs[c::num_channels]}

    def execute(self, channel: int, state: tuple[int, int]) -> tuple[None, Any]:
        """The answers to one run's requests, as one frame (None when every request failed)."""
        start, end = state
        answers = asyncio.run(self._gather(self.arguments[start:end]))
        rows = [row for answer in answers if answer is not None for row in answer]
        if not rows:
            return None, None
        frame = polars_module(type(self).__name__).from_records(rows, infer_schema_length=None)
        return None, frame.select(self.projection)

    async def _gather(self, arguments: list[Any]) -> list[Any]:
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            return list(await asyncio.gather(*(self._one(session, a) for a in arguments)))

    async def _one(self, session: aiohttp.ClientSession, argument: Any) -> Any:
        try:
            return await self._request(session, argument)
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError) as exc:
            log.warning(
                "%s: the request for %r failed (%s: %s); left out", type(self).__name__, argument, type(exc).__name__, exc
            )
            return None

    async def _request(self, session: aiohttp.ClientSession, argument: Any) -> list[dict[str, Any]]:
        """The rows one request's answer gives."""
        raise NotImplementedError


class InputRestGetAPIDataset(_Requests):
    """`GET url + argument` for each argument, each answer a JSON object: one row of the `projection` keys."""

    def __init__(
        self,
        url: str,
        arguments: Sequence[str],
        headers: Any = None,
        projection: Sequence[str] | None = None,
        batch_size: int = 10000,
        timeout: float = 60.0,
    ) -> None:
        super().__init__(url, arguments, headers, projection, batch_size, timeout)

    async def _request(self, session: aiohttp.ClientSession, argument: Any) -> list[dict[str, Any]]:
        async with session.get(self.url + str(argument), headers=self.headers) as response:
            response.raise_for_status()
            record = await response.json(content_type=None)
        if not isinstance(record, dict):
            raise TypeError(f"the answer is a {type(record).__name__}, not a JSON object")
        return [{k: record.get(k) for k in self.projection}]


class InputRestPostAPIDataset(_Requests):
    """`POST url` with each argument as its JSON body; each answer's `result` is a list of rows."""

    def __init__(
        self,
        url: str,
        arguments: Sequence[Any],
        headers: Any = None,
        projection: Sequence[str] | None = None,
        batch_size: int = 1000,
        timeout: float = 60.0,
    ) -> None:
        super().__init__(url, arguments, headers, projection, batch_size, timeout)

    async def _request(self, session: aiohttp.ClientSession, argument: Any) -> list[dict[str, Any]]:
        async with session.post(self.url, data=json.dumps(argument), headers=self.headers) as response:
            response.raise_for_status()
            answer = await response.json(content_type=None)
        rows = answer["result"]
        if not isinstance(rows, list):
            raise TypeError(f"the answer's result is a {type(rows).__name__}, not a list of rows")
        return rows


__all__ = ["InputRestGetAPIDataset", "InputRestPostAPIDataset"]
