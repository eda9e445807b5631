"""The hooks pytest-cachecheck calls, for other plugins and ``conftest.py`` files to implement. The plugin
registers them in ``pytest_addhooks``; like pytest's own, an implementation may take any subset of the
arguments.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional, Type

import pytest

if TYPE_CHECKING:
    from .clients.base import ChatClient


@pytest.hookspec
def pytest_cachecheck_server_kinds(config: pytest.Config) -> Optional[List[Type[ChatClient]]]:
    """Server kinds the plugin does not know: a list of ``pytest_cachecheck.ChatClient`` subclasses
    (None adds none).

    Every implementation's list counts (the lists are joined, in pluggy's calling order: the plugin
    registered last first, ``tryfirst``/``trylast`` as usual; a class named twice counts once). The hook is
    called when the servers are detected (in ``pytest_sessionstart``, and on each xdist worker before its
    first probe), so a plugin registered in its own ``pytest_configure`` still counts.

    Detection asks these classes first, in that order, and then the built-in kinds (llama.cpp, SGLang, vLLM,
    and last any OpenAI-compatible server): the first whose ``detect(http)`` returns a ``ServerInfo``
    serves the URL. Yours come first because a server of your kind may also answer like a built-in one (a
    vLLM fork serves ``/version`` too), and because the generic OpenAI kind recognises every server, so a
    kind tried after it would never be chosen. Your ``detect`` must therefore return None, quickly and
    without generating, for every server that is not of your kind; it may raise
    ``pytest_cachecheck.RequestError``.

    A class sets ``kind`` (the name shown in the header and the reports) and overrides what its server does
    differently from :class:`~pytest_cachecheck.ChatClient`: ``detect``; ``cache_plan`` (the fields that
    make turn 1 start clean and turn 2 reuse it) and ``scratch`` (the fields of a request computed from
    scratch), which one-server mode needs; ``cached_tokens`` when the hit counter is not
    ``usage.prompt_tokens_details.cached_tokens``; and, optionally, ``block_size``, ``prefix_caching``,
    ``setup_problems``, ``render``, ``token_pieces``, the ``check_*`` setup checks, and the class attributes
    ``reporting_flag``, ``names_model`` and ``lists_models``. A kind whose server keeps caches apart by
    ``cache_salt`` can subclass ``pytest_cachecheck.VllmClient`` or ``SglangClient`` and change only
    ``kind`` and ``detect``. ``--cachecheck-mode auto`` runs every kind other than ``"llama.cpp"`` in
    one-server mode.

    Anything in the lists that is not a ``ChatClient`` subclass is a usage error that names it, before any
    request. Example, in ``conftest.py``::

        from pytest_cachecheck import ServerInfo, VllmClient

        class AcmeClient(VllmClient):
            kind = "acme"

            @classmethod
            def detect(cls, http):
                status, data = http.get("/acme/version")
                if status != 200 or not isinstance(data, dict):
                    return None
                return ServerInfo(kind=cls.kind, build=str(data.get("version")))

        def pytest_cachecheck_server_kinds():
            return [AcmeClient]
    """
