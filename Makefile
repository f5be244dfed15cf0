# The two commands of the README. Each does its own set-up first.
.PHONY: run demo test build bench header

CC ?= cc
RELEASE := target/release

# The main job: a tiny Llama (Transformers) trained on tpu under
# defer-and-fuse, against the same model on torch CPU eager.
run: build
	.venv/bin/python examples/train_llama.py

# A tour of the C ABI: devices, HBM pools, streams and events, eager modes.
demo: build
	$(CC) -std=c11 -O2 -Wall -Werror -Iinclude examples/demo.c $(RELEASE)/libtpurt.a \
	  -lpthread -ldl -lm -o $(RELEASE)/tpurt-demo
	$(RELEASE)/tpurt-demo

build:
	scripts/setup

test:
	scripts/setup
	scripts/test

bench:
	bench/run

header:
	TPURT_UPDATE_HEADER=1 cargo test -p tpurt-capi --test header
