"""`kvloop` command line: generate, chat, serve, operator (and more as components land)."""

from __future__ import annotations

import argparse
import sys

from kvloop.engine.config import EngineConfig
from kvloop.engine.core.config_options import add_config_args, config_from_args


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """The engine flags, generated from the config dataclasses' option fields (defaults included)."""
    add_config_args(p, EngineConfig)


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    return config_from_args(EngineConfig, args)


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[])


def sampling_from_args(args: argparse.Namespace):
    from kvloop.engine.core.sampling import SamplingParams

    return SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                          top_k=args.top_k, seed=args.seed, stop=args.stop)


def cmd_generate(args: argparse.Namespace) -> int:
    from kvloop.engine.engine_core import EngineCore
    from kvloop.engine.llm import LLM

    llm = LLM(engine=EngineCore(engine_config_from_args(args)))
    for out in llm.generate(args.prompt, sampling_from_args(args)):
        print(out.text)
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    from kvloop.engine.engine_core import EngineCore
    from kvloop.engine.llm import LLM

    llm = LLM(engine=EngineCore(engine_config_from_args(args)))
    params = sampling_from_args(args)
    messages: list[dict] = [{"role": "system", "content": args.system}] if args.system else []
    one_shot = args.message is not None
    while True:
        text = args.message if one_shot else _read_user()
        if text is None:
            return 0
        messages.append({"role": "user", "content": text})
        reply = llm.chat(messages, params).text
        print(reply if one_shot else f"assistant> {reply}", flush=True)
        messages.append({"role": "assistant", "content": reply})
        if one_shot:
            return 0


def _read_user() -> str | None:
    try:
        line = input("user> ")
    except EOFError:
        return None
    return None if line.strip() in ("/quit", "/exit") else line


def cmd_serve(args: argparse.Namespace) -> int:
    from kvloop.engine.server.launch import serve

    if args.config:
        from kvloop.engine.settings_file import load_engine_settings

        config, extras = load_engine_settings(args.config)
        if extras["served_name"] and not args.served_model_name:
            args.served_model_name = [extras["served_name"], "default"]
        if extras["log_level"]:
            args.log_level = extras["log_level"]
        return serve(args, config)
    return serve(args, engine_config_from_args(args))


def cmd_operator(args: argparse.Namespace) -> int:
    from kvloop.operator.main import run_from_args

    return run_from_args(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvloop", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="complete prompts offline")
    add_engine_args(gen)
    add_sampling_args(gen)
    gen.add_argument("prompt", nargs="+")
    gen.set_defaults(func=cmd_generate)
    chat = sub.add_parser("chat", help="chat with the model in the terminal (or one message with -m)")
    add_engine_args(chat)
    add_sampling_args(chat)
    chat.add_argument("-m", "--message", default=None, help="send one message, print the reply, exit")
    chat.add_argument("--system", default=None, help="system prompt (default: the model template's)")
    chat.set_defaults(func=cmd_chat)
    srv = sub.add_parser("serve", help="serve the OpenAI-compatible API (FastAPI + uvicorn)")
    add_engine_args(srv)
    from kvloop.engine.server.launch import add_server_args

    add_server_args(srv)
    srv.add_argument("--config", default=None,
                     help="engine settings file (the operator's engine.yaml); replaces the engine flags")
    srv.set_defaults(func=cmd_serve)
    from kvloop.operator.main import __doc__ as operator_doc
    from kvloop.operator.main import add_operator_args

    op = sub.add_parser("operator", help="run the InferenceService operator (kopf)", description=operator_doc,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_operator_args(op)
    op.set_defaults(func=cmd_operator)
    from kvloop.engine.control.cli import add_control_parser
    from kvloop.sidecar.cli import add_sidecar_parser

    add_control_parser(sub)
    add_sidecar_parser(sub)
    from kvloop.engine.bench.cli import add_bench_parser

    add_bench_parser(sub)
    from kvloop.engine.sim.cli import add_simulate_parser

    add_simulate_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
