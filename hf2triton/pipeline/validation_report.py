"""The validation report as markdown (results/validation/report.md): the server, one row per check, the samples."""

from __future__ import annotations

import time
from typing import Any

from hf2triton import host


def render_markdown(report: dict[str, Any]) -> str:
    server = report["server"]
    lines = [
        "# hf2triton validation report",
        "",
        f"**Result: {'PASS' if report['ok'] else 'FAIL'}** — {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(report['finished_at']))}",
        "",
        f"Server: Triton {server.get('version', '?')} ({server.get('origin', '?')}), live={server.get('live')}, "
        f"ready={server.get('ready')}, HTTP {server.get('http')}, gRPC {server.get('grpc')}, pid {server.get('pid')}",
        "",
        *([f"Host: {host.describe_torch(report['torch'])}", ""] if "torch" in report else []),
        "| model | task | backend | check | result | detail |",
        "|---|---|---|---|---|---|",
    ]
    for name, model in report["models"].items():
        for item in model["checks"]:
            detail = item["detail"].replace("|", "\\|").replace("\n", " ")
            result = "ok" if item["ok"] else "**FAIL**"
            lines.append(f"| {name} | {model.get('task', '')} | {model.get('backend', '')} | {item['name']} | {result} | {detail} |")
    lines += ["", "## Samples", ""]
    for name, model in report["models"].items():
        if "sample" in model:
            lines.append(f"- **{name}**: `{model['sample']['input']}` → `{model['sample']['output']}`")
    return "\n".join(lines) + "\n"
