"""Load clients shared by the end-to-end tests and the benchmarks: streaming tenants with an
OpenAI SDK's retry rule (harness), the SDK's back-off (sdk_retry), a lean HTTP/1.1 client (http1),
and the mock upstream in a process of its own (mock). They live under tests/ because the tests
import nothing from bench/; the benchmarks take them from here."""
