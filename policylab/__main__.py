from policylab.apps.cli import main

main()
