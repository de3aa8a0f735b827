"""APIs of other transfer libraries on moongate: mooncake (Mooncake's TransferEngine)."""
