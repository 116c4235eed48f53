"""Makes torch's C++ logging write a line (a store wait that times out: c10d's waitForInput
warning) after ``init_process_group``, which has set the rank that torch prefixes it with."""
import datetime

import torch.distributed as dist

dist.init_process_group("gloo")
try:
    dist.distributed_c10d._get_default_store().wait(["absent"],
                                                      datetime.timedelta(milliseconds=200))
except dist.DistStoreError:
    print("the wait timed out", flush=True)
dist.destroy_process_group()
