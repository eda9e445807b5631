"""``python -m tests.support.emulator``: serve an emulated vLLM or SGLang until Ctrl-C."""

from __future__ import annotations

import argparse
import time
from typing import List, Optional

from .config import _DEFAULT_VERSIONS, EmulatorConfig
from .core import Emulator
from .text import CHAT_TEMPLATES


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.emulator", description="Serve an emulated vLLM or SGLang until Ctrl-C."
    )
    parser.add_argument("--flavor", choices=sorted(_DEFAULT_VERSIONS), default="vllm")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--model", default="emu/tiny-chat")
    parser.add_argument("--block-size", type=int, default=16, help="vLLM block size / SGLang page size")
    parser.add_argument(
        "--no-prefix-caching",
        action="store_true",
        help="as vLLM --no-enable-prefix-caching / SGLang --disable-radix-cache",
    )
    parser.add_argument(
        "--no-cache-report",
        action="store_true",
        help="without vLLM --enable-prompt-tokens-details / SGLang --enable-cache-report",
    )
    parser.add_argument("--ignore-salt", action="store_true", help="a build that ignores cache_salt")
    parser.add_argument("--api-key", default=None)
    parser.add_argument(
        "--diverge-marker",
        action="append",
        default=None,
        help="prompts containing this answer differently on a cache hit (repeatable)",
    )
    parser.add_argument(
        "--chat-template",
        choices=CHAT_TEMPLATES,
        default="chatml",
        help="chatml; drop-reasoning (Qwen3: past turns lose their <think> block); empty-think-prompt "
        "(Qwen3 with enable_thinking false: the generation prompt ends with an empty think block)",
    )
    parser.add_argument(
        "--reasoning",
        action="store_true",
        help="a thinking model behind a reasoning parser: <think>...</think> before each answer",
    )
    parser.add_argument(
        "--no-health-generate",
        action="store_true",
        help="SGLang with SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false: /health does not generate",
    )
    args = parser.parse_args(argv)
    config = EmulatorConfig(
        flavor=args.flavor,
        model=args.model,
        block_size=args.block_size,
        prefix_caching=not args.no_prefix_caching,
        report_cached_tokens=not args.no_cache_report,
        honor_salt=not args.ignore_salt,
        api_key=args.api_key,
        diverge_on_hit=set(args.diverge_marker) if args.diverge_marker else None,
        chat_template=args.chat_template,
        reasoning=args.reasoning,
        health_generates=not args.no_health_generate,
    )
    emulator = Emulator(config, host=args.host, port=args.port).start()
    health = ""
    if config.flavor == "sglang":
        health = f", /health {'generates' if config.health_generates else 'does not generate'}"
    print(
        f"emulated {config.flavor} {config.version} serving {config.model!r} at {emulator.url} "
        f"(block size {config.block_size}, prefix caching {'on' if config.prefix_caching else 'off'}, "
        f"cache report {'on' if config.report_cached_tokens else 'off'}, salt "
        f"{'honoured' if config.honor_salt else 'ignored'}, chat template {config.chat_template}, reasoning "
        f"{'on' if config.reasoning else 'off'}{health}); Ctrl-C stops it",
        flush=True,
    )
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        emulator.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
