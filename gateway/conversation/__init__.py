"""What the gateway keeps of a conversation for its client: sealed reasoning, stored responses."""
