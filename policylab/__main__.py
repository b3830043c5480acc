from policylab.cli import main

main()
