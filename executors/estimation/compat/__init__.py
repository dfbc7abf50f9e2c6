"""mixle 0.8.2's shapes over our EM: audited and resilient mp handles, reference handle classes, interop, shards."""
