"""Model files we write and read: the typed checkpoint (atomic, weights_only), official weights, Megvii's files."""
