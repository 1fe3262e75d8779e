"""Head to head: one training job through s3torchconnector and through hapi, on the testbed."""
