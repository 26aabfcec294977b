"""``python -m s3_saver``: the operator's command line (see `s3_saver.cli`)."""

from s3_saver.cli import main

if __name__ == "__main__":
    main()
