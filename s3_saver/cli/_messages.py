"""The library's messages in the command line's words.

The saver's errors advise a Python caller: ``region_name``, ``table=...``,
``import_thread``, ``saver.setup()``. They stay so for library users; the command
line says the same advice with its options and commands (``--region``,
``--table``, the ``import`` command). `cli_words()` rewrites one message.

Each rule is pinned by tests/test_cli.py, which meets its message through a command
where one can, and which fails when the library gains a message naming a Python
parameter or method that no rule covers.
"""

from __future__ import annotations

import re

# A Python string literal as repr() writes it (the ids and names the messages quote).
_QUOTED = r"""(?:'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")"""

# Whole phrases first: their grammar changes with the words.
_PHRASES: list[tuple[str, str]] = [
    # The import of a thread that exists (import_thread), and copy_thread likewise.
    (
        r"\(delete_thread it first, or pass thread_id=\.\.\.\)",
        "(delete it first with `delete THREAD`, or import under another id with --as)",
    ),
    (r"\(delete_thread it first\)", "(delete it first with `delete THREAD`)"),
    # A bucket or table that does not exist (errors.translate).
    (r"run saver\.setup\(\) or deploy infra/", "run the `setup` command or deploy infra/"),
    (r"Check the bucket name and region_name;", "Check the bucket name and --region;"),
    (
        r"check region_name \(setup\(\) there would create a second, empty index\)",
        "check --region (the `setup` command there would create a second, empty index)",
    ),
    (r"run setup\(\) again", "run the `setup` command again"),
    # setup of a table next to a bucket in another region.
    (
        rf"setup\(\) created nothing: set region_name=({_QUOTED}) if the table lives with the bucket, "
        r"or pass clients for each region",
        r"`setup` created nothing: give --region \1 if the table lives with the bucket "
        "(a table in another region than its bucket takes the Python API's clients)",
    ),
    # A prefix of the other index mode: the library names both spellings; the command line's.
    (rf"Pass table={_QUOTED} \(command line: (--table [^,]*), or (CHECKPOINT_TABLE=[^)]*)\)", r"Pass \1 (or \2)"),
    (
        r"Pass the table that indexes them \(table=\.\.\.; command line: --table NAME, or CHECKPOINT_TABLE\)",
        "Pass the table that indexes them (--table NAME, or CHECKPOINT_TABLE)",
    ),
    (r"Leave the table out \(command line: ", "Leave the table out ("),
    # A prefix of another table: no option configures a replica (the Python saver's Replica).
    (rf"\. A saver whose Replica names table {_QUOTED} \(the other region's\) is accepted$", ""),
    (r"\(made by setup\(\) first, if need be\)", "(made by the `setup` command first, if need be)"),
    (r"written once by setup\(\)", "written once by the `setup` command"),
    # A table of another key schema.
    (r"\(setup\(\) creates it with that schema\)", "(the `setup` command creates it with that schema)"),
    # Another bucket's table or prefix; a store without conditional writes.
    (r"\(table=\.\.\.\) or another prefix \(prefix=\.\.\.\)", "(--table) or another prefix (--prefix)"),
    (r"a DynamoDB table \(table=\.\.\.\)", "a DynamoDB table (--table)"),
    # The constructor's checks of the global options.
    (rf"(?<![\w.])bucket=(?={_QUOTED})", "--bucket "),
    (r"the prefix goes in prefix=", "the prefix goes in --prefix"),
    (rf"(?<![\w.])table=(?={_QUOTED})", "--table "),
    (r"pass table=None for the manifest index", "pass --table '' for the manifest index"),
    (
        r"^(dynamodb_|s3_)?endpoint_url must be an http:// or https:// URL, got str: ",
        lambda m: f"--{(m.group(1) or '').replace('_', '-')}endpoint-url must be an http:// or https:// URL, got ",
    ),
    # Threads written with an EncryptedSerializer (the serializer's name in the message).
    (
        r"pass serde=EncryptedSerializer\.from_pycryptodome_aes\(key=\.\.\.\) with the key it was written with",
        "pass --serde langgraph.checkpoint.serde.encrypted:EncryptedSerializer.from_pycryptodome_aes "
        "with the key it was written with in LANGGRAPH_AES_KEY",
    ),
    (
        r"pass serde=EncryptedSerializer\(\.\.\.\) with the key it was written with",
        "pass --serde MODULE:ATTR naming an EncryptedSerializer with the key it was written with",
    ),
    # Encryption (encryption=KmsKey(...) or LocalKey(...): --kms-key, --local-key).
    (
        r"this (?:saver|store) has no encryption=: pass the KmsKey\(\.\.\.\) or LocalKey\(\.\.\.\) it was written with",
        "no --kms-key or --local-key was given: give the one it was written with",
    ),
    (r"this (?:saver|store) encrypts \(encryption=([^)]*)\)", r"this command encrypts (\1)"),
    (
        r"has no encryption=: give it the key the records are wrapped by now \(KmsKey or LocalKey\)",
        "was given no --kms-key or --local-key: give the key the records are wrapped by now",
    ),
    (
        r"LocalKey\(\) needs a master key: pass key= \(32 bytes, or their base64 text\) or set ",
        "--local-key needs a master key: set ",
    ),
    (
        r"encryption= needs the cryptography package:",
        "--kms-key and --local-key need the cryptography package:",
    ),
    (r"^KmsKey needs a KMS key id", "--kms-key needs a KMS key id"),
    (r"^key_bucket=", "--key-bucket "),
    # An archived thread: restore it first.
    (rf"call saver\.restore_thread\(({_QUOTED})\) \(or arestore_thread\): ", r"run `restore \1`: "),
    (rf"restore_thread\(({_QUOTED})\) brings it back", r"`restore \1` brings it back"),
    (r"; call it again (after|once done)", r"; run it again \1"),
    # Retries: a command line user has no deadline() to give.
    (r" within the retry budget and deadline\(\)\)", " within the retry budget)"),
    (r", within the retry budget and deadline\(\)\)", ", within the retry budget)"),
    (r"within the retry budget and deadline\(\)", "within the retry budget"),
    # encrypt without a key (the command refuses first; the library's words, said the CLI's way).
    (r"build the saver with encryption=KmsKey\(\.\.\.\) or LocalKey\(\.\.\.\)", "give --kms-key KEY or --local-key"),
    (
        r"build the store with encryption=KmsKey\(\.\.\.\) or LocalKey\(\.\.\.\) \(or S3Store\.from_saver of an encrypting saver\)",
        "give --kms-key KEY or --local-key",
    ),
    # migrate's PostgreSQL source or target: PostgresSaver.setup() creates or migrates its tables.
    (r": setup\(\) failed: ", ": creating or migrating its tables failed: "),
]

# Then the saver's methods, named as the commands that call them.
COMMANDS = {
    "import_thread": "import",
    "export_thread": "export",
    "copy_thread": "copy",
    "delete_thread": "delete",
    "delete_for_runs": "delete --run",
    "erase_thread": "erase",
    "encrypt_thread": "encrypt",
    "encrypt_namespaces": "encrypt",
    "archive_thread": "archive",
    "archive_idle": "archive --idle",
    "restore_thread": "restore",
    "rebuild_index": "rebuild-index",
    "collect_garbage": "gc",
    "list_threads": "threads",
    "import_memory": "memory import",
    "erase_namespace": "memory erase",
    "export_memory": "memory export",
}
_METHOD = re.compile(r"\b(?:saver\.)?(" + "|".join(COMMANDS) + r")\b(?:\(\))?")

# A saver URL's own errors (migrate --from/--to s3://...): there the S3Saver arguments
# are the URL's parameters, not the global options. `url_words()` says them so before
# `cli_words()` sees the message (nothing Python-named is left for it to rewrite).
_URL_PHRASES: list[tuple[str, str]] = [
    (rf"(?<![\w.?&])(bucket|table)=(?={_QUOTED})", r"the \1 "),
    (r"pass table=None for the manifest index", "leave table out of the URL for the manifest index"),
    (r"the prefix goes in prefix=", "the prefix goes in the URL's path"),
    (r"\bregion_name\b", "region"),
]

_RULES = [(re.compile(pattern), replacement) for pattern, replacement in _PHRASES]
_URL_RULES = [(re.compile(pattern), replacement) for pattern, replacement in _URL_PHRASES]


def cli_words(message: str) -> str:
    """``message`` with the Python names of its advice replaced by the command line's."""
    for pattern, replacement in _RULES:
        message = pattern.sub(replacement, message)
    return _METHOD.sub(lambda m: f"`{COMMANDS[m.group(1)]}`", message)


def url_words(message: str) -> str:
    """An error of a saver opened from a URL, in the URL's words (``table=`` is its parameter)."""
    for pattern, replacement in _URL_RULES:
        message = pattern.sub(replacement, message)
    return message
