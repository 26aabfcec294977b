"""The manifest index's activity entries: empty objects under ``listing/active/``, one per
day, thread and token, listed oldest day first (the rules both backends keep, and the layout,
are in ``_index/activity``); ``ManifestIndex`` mixes ``ManifestActivity`` in.
"""

from __future__ import annotations

from s3_saver._format import keys as _keys
from s3_saver._format.entries import Activity
from s3_saver._index.activity import _cursor_body, _lives_on, _read_cursor, new_entry
from s3_saver._index.manifest.doc import record_of
from s3_saver._transport.failures import OBJECT_MISSING, classify
from s3_saver._transport.protocol import Op, gather, raise_failure, request, request_one
from s3_saver._transport.s3 import DELETE_BATCH, S3Calls, put_immutable

# The one shard of the manifest's entries (S3 spreads a prefix's keys by itself).
_ONE = "0"


class ManifestActivity:
    """The manifest's activity entries (mixed into ``ManifestIndex``)."""

    activity_objects = True
    s3: S3Calls
    layout: _keys.KeyLayout

    def entry_key(self, entry: Activity) -> str:
        return self.layout.activity_key(entry.day, entry.thread_id, entry.token)

    def touch(self, thread_id: str, day: int) -> Op[None]:
        yield from put_immutable(self.s3, {self.entry_key(new_entry(thread_id, day)): b""})

    def stage_active(self, thread_id: str, day: int) -> Op[Activity]:
        """The entry's object, written now: the swap that records it in the head
        comes after (``with_active``), so a head names only entries written."""
        entry = new_entry(thread_id, day)
        yield from put_immutable(self.s3, {self.entry_key(entry): b""})
        return entry

    def untouch(self, entry: Activity) -> Op[None]:
        # Its own key: no other write made it. Kept if the head names it (a commit
        # that landed, its answer lost, then refused when sent again).
        head = self._cached(entry.thread_id)  # type: ignore[attr-defined]
        if head is None or head.active != entry.day or entry.token not in head.active_tokens:
            yield from self.drop_active([entry])

    def active_page(self, cursor: dict[str, str], until: int, size: int) -> Op[list[Activity]]:
        root = self.layout.activity_root
        page = yield from request_one(self.s3.list_keys(root, None, cursor.get(_ONE), size))
        found = []
        for o in page.get("Contents", []):
            parsed = self.layout.parse_activity_key(o["Key"])
            if parsed is None:
                continue  # not a key this layout builds
            day, thread_id, token = parsed
            if day > until:
                break
            found.append(Activity(day, thread_id, _ONE, o["Key"], token))
        return found

    def drop_active(self, entries: list[Activity]) -> Op[None]:
        # By key, which names the token: the entry read, never a newer one.
        keys = [self.entry_key(a) for a in entries]
        if keys:
            yield from request(*(self.s3.delete_many(keys[i : i + DELETE_BATCH]) for i in range(0, len(keys), DELETE_BATCH)))

    def load_cursor(self, name: str) -> Op[dict[str, str]]:
        call = self.s3.get(self.layout.activity_cursor_key(name))
        (result,) = yield (call,)
        if isinstance(result, BaseException):
            if classify(result, "get_object") == OBJECT_MISSING:
                return {}
            raise_failure(call, result)
        return _read_cursor(result["Body"], f"s3://{self.s3.bucket}/{self.layout.activity_cursor_key(name)}")

    def save_cursor(self, name: str, cursor: dict[str, str]) -> Op[None]:
        # A plain PUT: the cursor is replaced (last writer wins, see Index.save_cursor).
        call = self.s3._call(
            "put_object",
            {"Bucket": self.s3.bucket, "Key": self.layout.activity_cursor_key(name), "Body": _cursor_body(cursor).encode()},
        )
        yield from request_one(call)

    def erase_activity(self, thread_id: str, days: list[int]) -> Op[list[str]]:
        """Each day's entries of the thread listed (one listing per day, in one
        round trip: an admin call), then the head, then the entries deleted by
        the keys listed, but the one the head names (``_lives_on``). Returns the
        days' folders (prefixes of every key an entry of the day had)."""
        folders = [self.layout.activity_key(d, thread_id) for d in days]
        listed = yield from gather(*(self._listed(f) for f in folders))
        found = [a for entries in listed for a in entries]
        if found:
            head = yield from self._read_head(thread_id)  # type: ignore[attr-defined]
            yield from self.drop_active(_lives_on(found, record_of(head)))
        return folders

    def _listed(self, folder: str) -> Op[list[Activity]]:
        """The entries under ``folder`` (one day of one thread, with any token):
        the listing's prefix also matches threads whose encoded id extends it,
        which the exact parse leaves out."""
        want = self.layout.parse_activity_key(folder)
        out: list[Activity] = []
        token: str | None = None
        while True:
            page = yield from request_one(self.s3.list_keys(folder, token))
            for o in page.get("Contents", []):
                parsed = self.layout.parse_activity_key(o["Key"])
                if parsed is not None and want is not None and parsed[:2] == want[:2]:
                    out.append(Activity(parsed[0], parsed[1], _ONE, o["Key"], parsed[2]))
            token = page.get("NextContinuationToken")
            if not token:
                return out
