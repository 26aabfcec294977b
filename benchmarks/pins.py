"""Print the LangGraph pins the peer's virtualenv must share with ours.

``make bench`` installs langgraph-checkpoint-aws next to these exact versions,
so every saver runs the same graph code and InMemorySaver's results are a fair
reference for all of them.
"""

from importlib.metadata import PackageNotFoundError, version

SHARED = ("langgraph", "langgraph-checkpoint", "langchain-core")

pins = []
for name in SHARED:
    try:
        pins.append(f"{name}=={version(name)}")
    except PackageNotFoundError:
        pass
print(" ".join(pins))
