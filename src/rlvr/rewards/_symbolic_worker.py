"""math-verify in a process of its own (started by rlvr.rewards.symbolic; run as a script, never imported).

Protocol, JSON lines: it writes `{"ready": true}` once math-verify is imported, then answers each
request `{"gold": str, "answer": str, "limit_s": float}` with `{"equal": bool}` (plus `"error"`
when the comparison raised). One request is in flight at a time; the parent kills this process
when one runs past its time limit, so math-verify's own (signal-based) timeouts stay off. Should
the parent die first, a CPU-time limit set per request (RLIMIT_CPU) ends this process anyway. It
exits on end of input or after `idle_exit_s` seconds without a request. argv: idle_exit_s memory_mb.
"""

import json
import logging
import math
import resource
import select
import sys


def main() -> None:
    idle_exit_s, memory_mb = float(sys.argv[1]), int(sys.argv[2])
    if memory_mb > 0:  # 9^(9^9) fails with MemoryError instead of swapping the machine
        resource.setrlimit(resource.RLIMIT_AS, (memory_mb * 2**20, memory_mb * 2**20))
    logging.disable(logging.WARNING)  # math-verify warns on every call that its timeouts are off
    # At the default limit, a deeply nested expression makes math-verify's parser give up part-way
    # and return a piece of it ("1+(1+(...))" parsed as 1); the parent's time limit bounds the cost.
    sys.setrecursionlimit(20_000)
    from math_verify import parse, verify

    parsed: dict[str, list] = {}

    def parse_once(latex: str) -> list:
        if latex not in parsed:  # the G completions of a prompt share its gold answer
            if len(parsed) > 4096:
                parsed.clear()
            parsed[latex] = parse(f"${latex}$", parsing_timeout=None)
        return parsed[latex]

    stdin, stdout = sys.stdin.buffer, sys.stdout
    stdout.write('{"ready": true}\n')
    stdout.flush()
    while True:
        if not select.select([stdin], [], [], idle_exit_s)[0]:
            return
        line = stdin.readline()
        if not line:
            return
        request = json.loads(line)
        used = resource.getrusage(resource.RUSAGE_SELF)
        cpu_cap = math.ceil(used.ru_utime + used.ru_stime + request.get("limit_s", 10.0)) + 2
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_cap, resource.RLIM_INFINITY))  # SIGXCPU ends a runaway request
        try:
            gold, answer = parse_once(request["gold"]), parse_once(request["answer"])
            reply: dict[str, bool | str] = {"equal": bool(gold and answer and verify(gold, answer, timeout_seconds=None))}
        except (Exception, RecursionError, MemoryError) as e:  # a malformed or monstrous expression is not equal
            reply = {"equal": False, "error": f"{type(e).__name__}: {e}"[:300]}
        stdout.write(json.dumps(reply) + "\n")
        stdout.flush()


if __name__ == "__main__":
    main()
