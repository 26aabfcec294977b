"""What is stored and how it is spelled: object keys and their encoding, whose key a key
is, DynamoDB sort keys, the object formats and attribute values, index entries and
refs, what a thread needs (the closure), lists as keyframe and pieces, the archive
format. Pure: no I/O; imports ``errors`` only.
"""
