"""`make demo`: a LangGraph agent whose memory lives in S3 + DynamoDB.

Starts an embedded S3 + DynamoDB endpoint (moto's server, on 127.0.0.1 only),
runs a deterministic multi-node agent for a few turns with one human-approval
interrupt, then reads the thread's history back from the saver and shows what
it cost in requests. No LLM, no network.
"""

from __future__ import annotations

import logging
import operator
import os
import sys
from typing import Annotated, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Command, interrupt

from s3_saver import S3Saver

PRICES = {"s3": {"put_object": 0.005 / 1000, "get_object": 0.0004 / 1000}}


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    ledger: Annotated[list[str], operator.add]
    balance: int


def agent(state: State) -> dict:
    last = state["messages"][-1]
    if isinstance(last, HumanMessage):
        words = last.content.split()
        amount = int(words[1]) if len(words) > 1 and words[1].isdigit() else 0
        call = {"name": words[0], "args": {"amount": amount}, "id": f"call-{len(state['messages'])}"}
        return {"messages": [AIMessage(content="", tool_calls=[call])]}
    return {"messages": [AIMessage(content=f"Done. Balance is now {state['balance']}.")]}


def route(state: State) -> str:
    last = state["messages"][-1]
    return "tools" if isinstance(last, AIMessage) and last.tool_calls else END


def tools(state: State) -> dict:
    call = state["messages"][-1].tool_calls[0]
    amount = call["args"]["amount"]
    if call["name"] == "withdraw" and amount > 100:
        # A human must approve large withdrawals: the graph stops here and the
        # saver keeps everything until the resume arrives (minutes or days later).
        decision = interrupt({"question": f"Approve withdrawal of {amount}?"})
        if decision != "approve":
            return {"messages": [ToolMessage("rejected by reviewer", tool_call_id=call["id"])]}
    sign = -1 if call["name"] == "withdraw" else 1
    return {
        "messages": [ToolMessage(f"{call['name']} {amount}: ok", tool_call_id=call["id"])],
        "ledger": [f"{call['name']} {amount}"],
        "balance": state.get("balance", 0) + sign * amount,
    }


def build_graph(saver: S3Saver):
    builder = StateGraph(State)
    builder.add_node("agent", agent)
    builder.add_node("tools", tools)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", route, ["tools", END])
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=saver)


def start_local_endpoint() -> tuple[object, str]:
    # The test session's fixes to moto (as make bench applies them): moto's server, not
    # S3 or DynamoDB, breaks under concurrent conditional writes and transactions, and
    # printed "dictionary changed size during iteration" tracebacks in the middle of the demo.
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
    from moto_fixes import atomic_conditional_writes

    atomic_conditional_writes()
    from moto.server import ThreadedMotoServer

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ[name] = "demo"  # the embedded endpoint accepts any credentials
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    return server, f"http://{host}:{port}"


# List prices in us-east-1 (check them before quoting): S3 Standard PUT, COPY, POST and
# LIST $0.005 per 1,000, GET and HEAD $0.0004 per 1,000 (DELETE is free); DynamoDB
# on-demand $0.625 per million write units, $0.125 per million read units.
S3_WRITES = {"put_object", "copy_object", "list_objects_v2", "list_object_versions", "create_bucket"}
S3_FREE = {"delete_objects", "delete_object"}
DDB_READS = {"get_item", "batch_get_item", "query", "scan", "describe_table"}


def dollars(requests: dict[tuple[str, str], int]) -> float:
    """The requests' price. DynamoDB counted at one unit a request (its items here are small):
    a lower bound, since a batch or a transaction consumes a unit per item, twice for a transaction."""
    total = 0.0
    for (service, op), n in requests.items():
        if service == "s3" and op not in S3_FREE:
            total += n * (0.005 if op in S3_WRITES else 0.0004) / 1000
        elif service == "dynamodb":
            total += n * (0.125 if op in DDB_READS else 0.625) / 1_000_000
    return total


def show_costs(title: str, saver: S3Saver) -> None:
    stats = saver.stats.snapshot()
    s3 = {op: n for (svc, op), n in stats.requests.items() if svc == "s3"}
    ddb = {op: n for (svc, op), n in stats.requests.items() if svc == "dynamodb"}
    print(f"  {title}: {stats.round_trips} round trips, {stats.total_requests} requests, ${dollars(stats.requests):.7f}")
    print(f"    S3:       {', '.join(f'{op} x{n}' for op, n in sorted(s3.items())) or '-'}")
    print(f"    DynamoDB: {', '.join(f'{op} x{n}' for op, n in sorted(ddb.items())) or '-'}")
    saver.stats.reset()


def main() -> int:
    server, endpoint = start_local_endpoint()
    print(f"Embedded S3 + DynamoDB endpoint on {endpoint} (moto, local only)")
    print("A round trip is a wave of requests sent together: the latency you wait for.")
    print("Requests are what AWS bills; $ is their price at us-east-1 list prices.\n")
    saver = S3Saver("demo-checkpoints", table="demo-index", prefix="agents/", endpoint_url=endpoint, region_name="us-east-1")
    saver.setup()
    saver.stats.reset()
    graph = build_graph(saver)
    config = {"configurable": {"thread_id": "customer-42"}}

    print("1. Running the agent (each turn: agent -> tools -> agent)")
    for text in ["deposit 500", "withdraw 30", "withdraw 250"]:
        result = graph.invoke({"messages": [HumanMessage(text)]}, config)
        if "__interrupt__" in result:
            question = result["__interrupt__"][0].value["question"]
            print(f"   user: {text:<14} -> paused: {question}")
        else:
            print(f"   user: {text:<14} -> {result['messages'][-1].content}")
    show_costs("cost of the 3 turns", saver)

    print("\n2. A new saver object (think: the next Lambda invocation) resumes the interrupt")
    cold = S3Saver("demo-checkpoints", table="demo-index", prefix="agents/", endpoint_url=endpoint, region_name="us-east-1")
    pending = build_graph(cold).get_state(config)
    print(f"   waiting at node {pending.next}, question: {pending.tasks[0].interrupts[0].value['question']}")
    show_costs("cost of reading the state in a cold process", cold)
    result = build_graph(cold).invoke(Command(resume="approve"), config)
    print(f"   reviewer: approve -> {result['messages'][-1].content}")
    show_costs("cost of resuming (the run reads the thread again, writes 2 steps)", cold)

    print("\n3. History read back from the saver (newest first)")
    history = list(graph.get_state_history(config))
    for snap in history:
        meta = snap.metadata or {}
        print(
            f"   step {meta.get('step'):>2} {meta.get('source'):<6} next={str(list(snap.next)):<12} "
            f"balance={snap.values.get('balance', '-'):<5} messages={len(snap.values.get('messages', []))}"
        )
    show_costs(f"cost of get_state_history ({len(history)} checkpoints)", saver)

    print("\n4. Time travel: fork from the checkpoint before the large withdrawal")
    before = next(s for s in history if s.values.get("balance") == 470 and s.next == ("agent",))
    forked = graph.update_state(before.config, {"messages": [HumanMessage("withdraw 20")]})
    result = graph.invoke(None, forked)
    print(f"   forked branch ends with: {result['messages'][-1].content}")
    show_costs("cost of the fork", saver)

    print("\nStorage layout in the bucket (immutable objects; the index is in DynamoDB):")
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="demo-checkpoints")["Contents"]]
    kinds = {}
    for key in keys:
        parts = key.split("/")  # agents/live/<thread>/<namespace>/<kind>/..., or the index-mode marker
        kinds.setdefault(parts[4] if len(parts) > 4 else parts[-1], []).append(key)
    for kind, members in sorted(kinds.items()):
        print(f"   {len(members):>3} x {kind:<12} e.g. {members[0]}")
    print("   (unchanged channels are never written again; small values ride inside the checkpoint object)")

    saver.delete_thread("customer-42")
    assert saver.get_tuple(config) is None
    print("\nThread deleted. Done.")
    saver.close()
    cold.close()
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
