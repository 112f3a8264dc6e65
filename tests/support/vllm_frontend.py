"""vLLM's own chat front end, without an engine, for tests: what a `vllm.entrypoints.openai.api_server` started with
a given argv renders for a chat request (prompt token ids) and returns for generated token ids (the assistant
message its tool-call / reasoning parsers make of them).

It runs in two roles (importing vLLM is slow, and the tests' own process need not pay for it):

* as a script under vLLM's Python it builds, for each server argv it is given, exactly what vLLM's GPU-less
  render server builds (`vllm.entrypoints.launchers.render`: the CLI parser, `create_model_config`,
  `renderer_from_config`, `OnlineRenderer`, `OnlineDerenderer` — the same classes the API server answers chat
  requests with) and answers JSON lines on stdin: {"op": "init", "server": name, "argv": [...]};
  {"op": "render", "server": name, "request": body} -> {"prompt_token_ids": [...]};
  {"op": "derender", "server": name, "request": body, "token_ids": [...], "prompt_token_ids": [...]} ->
  {"message": {...}};
* imported by tests (`VllmFrontends()`, one process for several servers: importing vLLM is the slow part), it
  starts that script and talks to it.

The interpreter is $LONGHAUL_VLLM_PYTHON, else this one (the project venv holds vLLM's CPU build beside veRL).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def vllm_python() -> Path | None:
    """vLLM's interpreter, or None when it is not installed here (and CI did not ask for it)."""
    py = Path(os.environ.get("LONGHAUL_VLLM_PYTHON", sys.executable))
    if py.exists():
        return py
    if os.environ.get("LONGHAUL_VLLM_PYTHON"):
        raise FileNotFoundError(f"LONGHAUL_VLLM_PYTHON={py} does not exist: run make install")
    return None


class VllmFrontends:
    """A running front-end process; `add(name, argv)` configures one server (argv: the arguments after
    `-m <module>`)."""

    def __init__(self, python: Path) -> None:
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "VLLM_HOST_IP": "127.0.0.1",
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_LOGGING_LEVEL": "ERROR",
        }
        self.proc = subprocess.Popen(
            [str(python), __file__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        ready = self.proc.stdout.readline()
        if not ready.startswith("ready"):
            self.proc.kill()
            raise RuntimeError(f"vLLM front end did not start: {ready!r}\n{self.proc.stderr.read()[-4000:]}")

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"vLLM front end exited:\n{self.proc.stderr.read()[-4000:]}")
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"vLLM front end: {answer['error']}")
        return answer

    def add(self, server: str, argv: list[str]) -> None:
        """Configure `server` as vLLM's API server would be with `argv`."""
        self._ask({"op": "init", "server": server, "argv": list(argv)})

    def render(self, server: str, body: dict[str, Any]) -> list[int]:
        """Prompt token ids the server renders for a chat-completions request body."""
        return self._ask({"op": "render", "server": server, "request": body})["prompt_token_ids"]

    def derender(
        self, server: str, body: dict[str, Any], token_ids: list[int], prompt_token_ids: list[int]
    ) -> dict[str, Any]:
        """The assistant message (OpenAI shape) the server returns for generated `token_ids` (without the stop
        token, as the engine's text leaves it out)."""
        return self._ask(
            {
                "op": "derender",
                "server": server,
                "request": body,
                "token_ids": token_ids,
                "prompt_token_ids": prompt_token_ids,
            }
        )["message"]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# ---------------------------------------------------------------------------------------------------------
# The script side (vLLM's Python)


def _serve() -> None:  # pragma: no cover - runs under vLLM's interpreter
    import asyncio

    from vllm.config import VllmConfig
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import (
        make_arg_parser,
        resolve_default_chat_template_kwargs,
        validate_parsed_serve_args,
    )
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.scale_out.token_in_token_out.protocol import (
        GenerateTokensChoice,
        GenerateTokensResponse,
    )
    from vllm.renderers import renderer_from_config
    from vllm.renderers.chat_utils import load_chat_template
    from vllm.renderers.online_derenderer import OnlineDerenderer
    from vllm.renderers.online_renderer import OnlineRenderer
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    servers: dict[str, tuple[Any, Any]] = {}

    def init(server_args: list[str]) -> tuple[Any, Any]:
        args = make_arg_parser(FlexibleArgumentParser()).parse_args(server_args)
        validate_parsed_serve_args(args)
        engine_args = AsyncEngineArgs.from_cli_args(args)
        model_config = engine_args.create_model_config()
        model_config.quantization = None
        vllm_config = VllmConfig(
            model_config=model_config,
            logging_config=engine_args.create_logging_config(),
            structured_outputs_config=engine_args.create_structured_outputs_config(),
        )
        renderer = renderer_from_config(vllm_config)
        common = dict(
            model_config=model_config,
            renderer=renderer,
            request_logger=None,
            chat_template=load_chat_template(args.chat_template),
            chat_template_content_format=args.chat_template_content_format,
            trust_request_chat_template=args.trust_request_chat_template,
            enable_auto_tools=args.enable_auto_tool_choice,
            exclude_tools_when_tool_choice_none=args.exclude_tools_when_tool_choice_none,
            tool_parser=args.tool_call_parser,
            tool_strict_level=args.tool_strict_level,
            reasoning_parser=args.reasoning_parser or vllm_config.structured_outputs_config.reasoning_parser,
            default_chat_template_kwargs=resolve_default_chat_template_kwargs(args),
            log_error_stack=args.log_error_stack,
        )
        return OnlineRenderer(trust_request_mm_kwargs=args.trust_request_mm_kwargs, **common), OnlineDerenderer(
            **common
        )

    print("ready", flush=True)

    async def answer(req: dict[str, Any]) -> dict[str, Any]:
        if req["op"] == "init":
            servers[req["server"]] = init(req["argv"])
            return {}
        front, back = servers[req["server"]]
        request = ChatCompletionRequest(**req["request"])
        if req["op"] == "render":
            result = await front.render_chat(request)
            if not isinstance(result, tuple):
                return {"error": result.model_dump_json()}
            _, inputs = result
            return {"prompt_token_ids": list(inputs[0]["prompt_token_ids"])}
        generated = GenerateTokensResponse(
            choices=[GenerateTokensChoice(index=0, token_ids=req["token_ids"], finish_reason="stop")],
            prompt_token_ids=req["prompt_token_ids"],
        )
        choices = await back.derender_chat(generated, request, req["prompt_token_ids"])
        return {"message": choices[0].message.model_dump(mode="json", exclude_none=True)}

    async def loop() -> None:
        for line in sys.stdin:
            try:
                out = await answer(json.loads(line))
            except Exception as exc:  # noqa: BLE001 - reported to the test, which fails with it
                out = {"error": f"{type(exc).__name__}: {exc}"}
            print(json.dumps(out), flush=True)

    asyncio.run(loop())


if __name__ == "__main__":
    _serve()
