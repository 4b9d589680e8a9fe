"""Run the stand-in SGLang server: `python -m sglang_standin --model-path DIR --port P ...`."""

from sglang_standin.server import main

if __name__ == "__main__":
    main()
